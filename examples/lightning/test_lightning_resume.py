"""Resume tests for a Lightning run: `ModelCheckpoint(every_n_train_steps=split)` writes
`checkpoints/step_<split>.ckpt`, and `trainer.fit(ckpt_path=...)` resumes from it. The
script has no plugin line; the last test shows what the callback adds (`--callback`)."""

import importlib.util
from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

# find_spec, not importorskip: the ranks import lightning, this process need not
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs the lightning extra: pip install '.[lightning]'",
)

TRAIN = str(Path(__file__).with_name("train.py"))
COMMAND = [TRAIN, "--max-steps={steps}", "--save-every={split}", "--output-dir={run_dir}"]
CHECKPOINT = "{run_dir}/checkpoints/step_{split}.ckpt"


@resume_equivalent(steps=6, split=3, nproc=2)
def test_lightning_resumes_exactly(resume_equiv):
    resume_equiv.run(COMMAND, checkpoint=CHECKPOINT, resume_args=["--resume-from={checkpoint}"])


@resume_equivalent(steps=6, split=3, nproc=2)
def test_rank_0_rng_on_every_rank_is_caught(resume_equiv):
    """Lightning writes the checkpoint on rank 0 only, so a module that stores
    `torch.get_rng_state()` in it resumes every rank with rank 0's dropout stream; the demo
    prints and checks the report."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            COMMAND,
            checkpoint=CHECKPOINT,
            resume_args=["--resume-from={checkpoint}", "--bug=rank-0-rng"],
        )
    report = str(caught.value)
    print(report)
    assert "first divergence at step 4" in report
    assert "rank 1: at the resume point rng:cpu equals rank 0's saved state" in report


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_lightning_with_the_callback_resumes_exactly(resume_equiv):
    """An explicit call: `ResumeEquivCallback` records the loss `training_step` returned, the
    learning rate and the grad norm beside what every rank records by itself."""
    resume_equiv.run(
        [*COMMAND, "--callback"], checkpoint=CHECKPOINT, resume_args=["--resume-from={checkpoint}"]
    )
