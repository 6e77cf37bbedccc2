"""Resume tests on another number of ranks (resume_nproc=): the uninterrupted run and the
launch that saves run on `nproc` ranks, the resumed launch on `resume_nproc`. Equivalent there
means: every sample consumed exactly once at the same step over the global batch, and the
values equal on every rank (the all-reduced loss) within the topology's own numeric noise,
measured by one more uninterrupted run on `resume_nproc` ranks."""

from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train_cursor.py"))
COMMAND = [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"]


@resume_equivalent(steps=8, split=5, nproc=2, resume_nproc=1)
def test_global_cursor_resumes_from_two_ranks_onto_one(resume_equiv):
    resume_equiv.run(COMMAND, resume_args=["--resume-from={checkpoint}"])


@resume_equivalent(steps=8, split=5, nproc=1, resume_nproc=2)
def test_global_cursor_resumes_from_one_rank_onto_two(resume_equiv):
    resume_equiv.run(COMMAND, resume_args=["--resume-from={checkpoint}"])


@resume_equivalent(steps=8, split=5, nproc=2, resume_nproc=1)
def test_per_process_skip_is_caught_on_another_world_size(resume_equiv):
    """The caught-bug twin: skipping per process. A real test would simply fail with the
    report; this demo catches it so the example run stays green, and prints it (-rP)."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            COMMAND, resume_args=["--resume-from={checkpoint}", "--bug=per-process-skip"]
        )
    report = str(caught.value)
    print(report)
    assert "data NOT equivalent (a bug, not numeric noise)" in report
    assert "never seen" in report
    assert "likely cause (data order)" in report
