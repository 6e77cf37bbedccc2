"""What a caught batching bug looks like: accumulation over 2 micro-batches without dividing
each micro-batch's loss by 2. The report names the first quantity that differs (the step's
loss, twice the baseline's), beyond round-off, and the likely cause: the window's gradient is
2 times the baseline's, the ratio of accumulation steps, with its one fix."""

from pathlib import Path

import pytest

from pytest_resume_equiv import equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


@equivalent(
    steps=4,
    baseline=dict(nproc=1),
    variants={"accum2_unscaled": dict(nproc=1, args=["--accum", "2", "--bug", "no-accum-scale"])},
)
def test_unscaled_accumulation_is_caught(resume_equiv):
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run([TRAIN, "--steps", "{steps}"])
    report = str(caught.value)
    print(report)  # shown with -rP
    assert "the variant does not train the same model as the baseline" in report
    assert "step 1: loss: baseline" in report
    assert "likely cause (loss not scaled by accumulation)" in report
    assert "Fix: divide each micro-batch's loss by the accumulation steps" in report
