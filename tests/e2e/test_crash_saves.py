"""interrupt="crash" on savers that pick a folder by itself (tests/zoo/crashzoo.py): the
newest step folder, complete or not, and the newest one with its marker; A/B slots written
in place with `latest` moved last; every save crashed (`crash_saves="all"`), and a failed
point rerun alone by the line its report gives."""

import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, processes_mentioning, section_of

ZOO = Path(__file__).parent.parent / "zoo" / "crashzoo.py"

TESTS = """
from pytest_resume_equiv import resume_equivalent
import crashzoo

ROOT = "{run_dir}/checkpoints"


@resume_equivalent(steps=6, split=[2, 4], nproc=1, interrupt="crash", crash_points=["first"])
def test_newest_folder(resume_equiv):
    resume_equiv.run(crashzoo.train_newest_folder, checkpoint=ROOT)


@resume_equivalent(
    steps=6, split=[2, 4], nproc=1, interrupt="crash", crash_saves="all",
    crash_points=["first", "last"],
)
def test_newest_marked_folder(resume_equiv):
    resume_equiv.run(crashzoo.train_newest_marked_folder, checkpoint=ROOT)


@resume_equivalent(steps=5, split=[1, 2, 3], nproc=1, interrupt="crash", crash_points=["torn"])
def test_ab_slots(resume_equiv):
    resume_equiv.run(crashzoo.train_ab_slots, checkpoint=ROOT)


@resume_equivalent(
    steps=6, split=[2, 4], nproc=1, interrupt="crash", crash_points=["first", "returned"]
)
def test_forgets_the_optimizer(resume_equiv):
    resume_equiv.run(crashzoo.train_forgets_the_optimizer, checkpoint=ROOT)
"""


@pytest.mark.long(40)
def test_savers_that_pick_a_folder_and_every_save_crashed(pytester):
    """The newest folder, half written at the kill, crashes its resume (the torn
    checkpoint); the newest folder with its marker (meta.json, by rename) passes at every
    save, the first save's points refusing (nothing before it); A/B slots pass the kills
    inside their writes over the older slot, which `latest` does not name. The failing
    point's rerun line reruns that point alone, and it fails the same way."""
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_folders=TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-v", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=2, failed=2)

    newest = section_of(text, "test_newest_folder")
    assert re.search(
        r"first +rank 0: after torch\.save\(checkpoints/step_4/model\.pt\)\n +on disk: "
        r"checkpoints/step_2/\{meta\.json 11 B, model\.pt [\d.]+ KiB, optim\.pt [\d.]+ KiB\}, "
        r"checkpoints/step_4/\{model\.pt [\d.]+ KiB\}\n +-> FAILED: crashed on the torn checkpoint "
        r"\(rank 0: FileNotFoundError: \[Errno 2\] No such file or directory: "
        r"'checkpoints/step_4/optim\.pt'\)",
        newest,
    ), newest
    assert "likely cause (torn checkpoint): the resumed run loaded a checkpoint" in newest
    assert newest.count("Fix:") == 1, newest
    rerun = re.search(r"rerun this point alone: pytest (\S+) -p resume_equiv (.*)", newest)
    assert rerun is not None, newest
    assert rerun.group(1) == "'test_folders.py::test_newest_folder'"
    assert rerun.group(2).split() == [
        "--resume-equiv-device=cpu",
        "--resume-equiv-crash-point=s4.event0",
    ]

    # -v says the launches before they start, per crashed save
    assert "resume-equiv: crash at split 2: 2 crash points, 4 launches" in text
    assert "resume-equiv: crash at split 4: 2 crash points, 4 launches" in text
    assert (
        "crash at split 2: 1 exact, 1 refused of 2 crash points; crash at split 4: 2 exact, 0 refused "
        "of 2 crash points"
    ) in text
    assert "crash at split 3: 3 exact, 0 refused of 3 crash points" in text  # A/B slots

    # a resume bug of its own: the complete checkpoint's resume fails too, so the crash is
    # not blamed (no "torn checkpoint"); the cause is that resume's
    own = section_of(text, "test_forgets_the_optimizer")
    assert (
        "the resume from the complete checkpoint of step 4 (point 'returned': its save had "
        "returned) fails too: what differs is the trainer's own resume, not what the crash left"
    ) in own, own
    assert (
        "-> FAILED: resumed from the complete checkpoint of step 4, yet the state after "
        "loading differs from the uninterrupted run's at step 4 (rank 0: watch:optimizer.state)"
    ) in own, own
    assert "likely cause (optimizer never restored)" in own, own
    assert "torn checkpoint" not in own, own
    assert own.count("Fix:") <= 1, own

    alone = pytester.runpytest_subprocess(
        "test_folders.py::test_newest_folder", "-p", "resume_equiv", *rerun.group(2).split()
    )
    alone.assert_outcomes(failed=1)
    again = alone.stdout.str()
    assert "crash at split 4: 1 crash point in the save at step 4" in again, again
    assert "crashed on the torn checkpoint" in again
    assert processes_mentioning(str(pytester.path)) == []
