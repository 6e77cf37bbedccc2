"""The resume test the doctor runs in a pytest of its own: the tiny trainer of `ranks.py`,
on the device and ranks the doctor was given (through the environment)."""

from __future__ import annotations

import os

from pytest_resume_equiv import resume_equivalent
from pytest_resume_equiv.doctor.ranks import train

NPROC_ENV = "RESUME_EQUIV_DOCTOR_NPROC"
STEPS, SPLIT = 4, 2


@resume_equivalent(steps=STEPS, split=SPLIT, nproc=int(os.environ.get(NPROC_ENV, "2")))
def test_doctor_resume(resume_equiv):
    resume_equiv.run(train)
