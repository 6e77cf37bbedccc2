"""Resume tests for a StatefulDataLoader trainer with two worker processes: 8 samples in
batches of 2, so epoch 0 is steps 1-4 and epoch 1 is steps 5-8.

The chain resumes at step 2, that run's own checkpoint resumes at step 4, and that one's at
step 6, mid-epoch 1: every link is compared with the uninterrupted run, and every sample
(known by its content) is accounted exactly once. The trainer has no plugin line; the
caught-bug twin shows what recording more adds (`--watch-loader`)."""

from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train_stateful.py"))
COMMAND = [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"]


@resume_equivalent(steps=8, split=[2, 4, 6], nproc=1, chain=True)
def test_stateful_loader_resumes_again_and_again(resume_equiv):
    resume_equiv.run(COMMAND, resume_args=["--resume-from={checkpoint}"])


@resume_equivalent(steps=8, split=[2, 4, 6], nproc=1)
def test_stateful_loader_epoch_not_restored_is_caught(resume_equiv):
    """The caught-bug twin: the loader's state is loaded, the epoch is not. The resumes in
    epoch 0 and at its end pass; the one mid-epoch 1 replays epoch 0's order. A real test would
    simply fail with the report; this demo catches it so the example run stays green, and
    prints it (pytest -rP).

    An explicit call where it matters: the automatic records see the batches only by their
    content, never the loader. `--watch-loader` hands the loader to `req.watch` and records
    the dataset indices, so the report names the epoch the loader was not given back."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            [*COMMAND, "--watch-loader"],
            resume_args=["--resume-from={checkpoint}", "--bug=epoch-not-restored"],
        )
    report = str(caught.value)
    print(report)
    assert "split 6: data (sample_ids) after the resume: ids" in report
    assert "likely cause (data loader state)" in report
    assert "its epoch (sampler.epoch: uninterrupted 1, resumed 0)" in report
