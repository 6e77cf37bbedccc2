"""Resume tests for a hand-written accelerate loop: `save_state` at the split, `load_state`
and `skip_first_batches` to resume (mid-epoch, in the second epoch). The loop has no plugin
line; the last test shows what watching the `Accelerator` adds (`--watch-accelerator`)."""

import importlib.util
from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

# find_spec, not importorskip: the ranks import accelerate, this process need not
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None,
    reason="needs accelerate: pip install 'pytest-resume-equiv[hf]'",
)

TRAIN = str(Path(__file__).with_name("train.py"))
COMMAND = [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"]
# 4 steps per epoch: step 5 is the first step of the second epoch
# accelerate runs on CPU when its own variable says so (as `accelerate launch --cpu` sets it)
CPU = {"ACCELERATE_USE_CPU": "true"}
MARKER = resume_equivalent(steps=7, split=5, nproc=2, env=CPU)


@MARKER
def test_accelerate_loop_resumes_exactly(resume_equiv):
    resume_equiv.run(
        COMMAND,
        checkpoint="{run_dir}/step_{split}",
        resume_args=["--resume-from={checkpoint}"],
    )


@MARKER
def test_forgotten_skip_first_batches_is_caught(resume_equiv):
    """Without `skip_first_batches` the resumed epoch starts over; the demo catches the
    failure, prints the report (`pytest -rP`) and checks it."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            COMMAND,
            checkpoint="{run_dir}/step_{split}",
            resume_args=["--resume-from={checkpoint}", "--bug=no-skip"],
        )
    report = str(caught.value)
    print(report)
    assert "first divergence at step 6" in report
    assert "likely cause (data order)" in report


@resume_equivalent(steps=7, split=5, nproc=2, env=CPU, rng_mutation=False)
def test_watched_accelerator_resumes_exactly(resume_equiv):
    """An explicit call: `req.watch(accelerator=...)` audits what `save_state` saves beyond
    the model, optimizer and scheduler found by themselves (the prepared loader's position
    and sampler), and the loop records its sample ids."""
    resume_equiv.run(
        [*COMMAND, "--watch-accelerator"],
        checkpoint="{run_dir}/step_{split}",
        resume_args=["--resume-from={checkpoint}"],
    )
