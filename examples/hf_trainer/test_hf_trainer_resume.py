"""Resume tests for a Hugging Face `Trainer` run: the Trainer checkpoints at `save_steps`
into `<output_dir>/checkpoint-<step>`, and `resume_from_checkpoint` loads it. The script has
no plugin line; the last test shows what the callback adds (`--callback`)."""

import importlib.util
from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

# find_spec, not importorskip: the ranks import transformers, this process need not
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="needs the hf extra: pip install '.[hf]'",
)

TRAIN = str(Path(__file__).with_name("train.py"))
COMMAND = [TRAIN, "--max-steps={steps}", "--save-steps={split}", "--output-dir={run_dir}"]


@resume_equivalent(steps=6, split=3, nproc=2)
def test_hf_trainer_resumes_exactly(resume_equiv):
    resume_equiv.run(
        COMMAND,
        checkpoint="{run_dir}/checkpoint-{split}",
        resume_args=["--resume-from={checkpoint}"],
    )


@resume_equivalent(steps=6, split=3, nproc=2)
def test_ignored_data_skip_is_caught(resume_equiv):
    """`ignore_data_skip=True` trains the resumed run on the epoch's first batches again;
    the demo catches the failure, prints the report (`pytest -rP`) and checks it."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            COMMAND,
            checkpoint="{run_dir}/checkpoint-{split}",
            resume_args=["--resume-from={checkpoint}", "--bug=ignore-data-skip"],
        )
    report = str(caught.value)
    print(report)
    assert "first divergence at step 4" in report


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_hf_trainer_with_the_callback_resumes_exactly(resume_equiv):
    """An explicit call: `ResumeEquivCallback` records what the Trainer logs (its loss, learning
    rate and grad norm) beside what every rank records by itself."""
    resume_equiv.run(
        [*COMMAND, "--callback"],
        checkpoint="{run_dir}/checkpoint-{split}",
        resume_args=["--resume-from={checkpoint}"],
    )
