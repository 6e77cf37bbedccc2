"""Verdicts that hold on nondeterministic hardware, end to end: a correct two-rank trainer with
three kinds of simulated noise passes with the defaults, and real resume bugs in it fail with
their cause named (tests/zoo/noisezoo.py; real torchrun ranks on CPU/gloo).

One pytest session runs every case; the cases of one noise kind share its uninterrupted launch
and its determinism control, as tests in a user's suite do.
"""

import shutil
from pathlib import Path

import pytest
from helpers import CPU, gate_contradictions, section_of

ZOO = Path(__file__).parent.parent / "zoo" / "noisezoo.py"

CAUSES = {
    "optimizer_moments": ("likely cause", "'optimizer'", "at the resume point"),
    "owned_generator": ("the generator created at noisezoo.py:", "was never restored"),
    "cpu_rng": ("the CPU RNG (torch's default generator) was never restored",),
    "scheduler": ("the LR scheduler 'lr_scheduler' was never restored",),
}
CASES = [
    *[("unseeded", bug) for bug in CAUSES],
    *[("coarse", bug) for bug in ("optimizer_moments", "owned_generator")],
    *[("resumed-order", bug) for bug in ("optimizer_moments", "cpu_rng")],
]
NOISES = ("unseeded", "resumed-order", "coarse")


def _name(noise: str, bug: str) -> str:
    return f"test_{noise.replace('-', '_')}_{bug}"


def _module() -> str:
    lines = ["from pytest_resume_equiv import resume_equivalent", ""]
    marker = "@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)"
    for noise, bug in [*[(n, "none") for n in NOISES], *CASES]:
        command = ["noisezoo.py", f"--noise={noise}"]
        resume = [f"--bug={bug}"] if bug != "none" else []
        lines += [
            marker,
            f"def {_name(noise, bug)}(resume_equiv):",
            f"    resume_equiv.run({command!r}, resume_args={resume!r})",
            "",
        ]
    return "\n".join(lines)


@pytest.mark.long(120)
def test_noisy_correct_trainers_pass_and_real_bugs_fail_with_their_cause(pytester):
    shutil.copy(ZOO, pytester.path / ZOO.name)
    pytester.makepyfile(test_noisy=_module())
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-v", f"--resume-equiv-report={report}")
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    # where the resume point held, no cause blames an audited object's save or restore
    assert not gate_contradictions(report), gate_contradictions(report)
    problems = []
    for noise in NOISES:
        name = _name(noise, "none")
        if f"PASSED test_noisy.py::{name}" not in text:
            problems.append(
                f"{name}: a correct noisy trainer did not pass:\n{section_of(text, name)}"
            )
    for noise, bug in CASES:
        name = _name(noise, bug)
        section = section_of(text, name)
        if f"FAILED test_noisy.py::{name}" not in text:
            problems.append(f"{name}: not caught:\n{section[:2000]}")
            continue
        missing = [phrase for phrase in CAUSES[bug] if phrase not in section]
        if missing or "not deterministic" in section or "Traceback" in section:
            problems.append(
                f"{name}: report lacks {missing} or blames the noise:\n{section[:2500]}"
            )
    assert not problems, "\n".join(problems)
