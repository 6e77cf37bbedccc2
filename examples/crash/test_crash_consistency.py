"""Preempted in the middle of a save: `interrupt="crash"` kills every rank at each point of
the checkpoint save at the last split, then lets the trainer's own resume logic run on what
was left (train.py finds its latest complete checkpoint under --ckpt-root).

The atomic saver passes at every point. Its three twins are classic crash-consistency bugs;
each demo catches the failure so the example run stays green, prints the report (shown with
`pytest -rP`), and checks that it names the point that breaks the saver and what went wrong.
"""

from pathlib import Path

import pytest

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))
ROOT = "{run_dir}/checkpoints"


def command(saver: str) -> list[str]:
    args = ["--max-steps={steps}", "--save-at={splits}", "--ckpt-root={checkpoint}"]
    return [TRAIN, *args, f"--saver={saver}"]


def caught(resume_equiv, saver: str) -> str:
    with pytest.raises(pytest.fail.Exception) as failure:
        resume_equiv.run(command(saver), checkpoint=ROOT)
    report = str(failure.value)
    print(report)
    return report


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_an_atomic_save_survives_a_crash_at_every_point(resume_equiv):
    resume_equiv.run(command("atomic"), checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_saving_in_place_is_caught(resume_equiv):
    report = caught(resume_equiv, "in-place")
    assert "first failing point (first): rank 0: after torch.save(checkpoints/current/" in report
    assert "resumed from a torn or mixed checkpoint of step 2" in report


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_writing_latest_before_the_data_is_caught(resume_equiv):
    report = caught(resume_equiv, "latest-first")
    # the pointer is complete, the folder it names is not there yet
    assert "pointer   rank 0: after writing checkpoints/latest (closed, before" in report
    assert "crashed on the torn checkpoint (rank 0: FileNotFoundError" in report


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_deleting_the_previous_checkpoint_first_is_caught(resume_equiv):
    report = caught(resume_equiv, "delete-previous")
    assert "first failing point (first): rank 0: after shutil.rmtree(checkpoints/step_2)" in report
    assert "started over from step 0: lost the completed checkpoint of step 2" in report
    # the line that reruns that point alone, and its resume
    assert "--resume-equiv-crash-point=s4.event0" in report
