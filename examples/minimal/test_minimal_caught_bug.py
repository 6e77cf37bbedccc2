"""What a caught resume bug looks like.

The same trainer with `--bug=no-cpu-rng` forgets to restore the CPU RNG after loading its
checkpoint. A real test would simply fail with the report below; this demo catches the
failure so the example run stays green, prints the report (shown with `pytest -rP`), and
checks that it names the step, the rank and the cause.
"""

from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


@resume_equivalent(steps=6, split=3, nproc=2)
def test_forgotten_cpu_rng_is_caught(resume_equiv):
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"],
            resume_args=["--resume-from={checkpoint}", "--bug=no-cpu-rng"],
        )
    report = str(caught.value)
    print(report)
    assert "first divergence at step 4, rank 0" in report
    assert "likely cause (never restored): ranks 0-1: the CPU RNG" in report
