"""interrupt="crash" end to end (trainers in tests/zoo/crashzoo.py): every rank killed inside
the save, then the trainer's own resume logic judged. The shipped twins (in place, latest
first, delete previous) run in tests/e2e/test_examples.py."""

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


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_atomic(resume_equiv):
    resume_equiv.run(crashzoo.train_atomic, checkpoint=ROOT)


@resume_equivalent(steps=5, split=3, interrupt="crash")
def test_refuses(resume_equiv):
    resume_equiv.run(crashzoo.train_refuses, checkpoint=ROOT)


@resume_equivalent(steps=5, split=3, interrupt="crash", crash_points=["first"], crash_refusal="fail")
def test_refusal_that_must_not_happen(resume_equiv):
    resume_equiv.run(crashzoo.train_refuses, checkpoint=ROOT)


@resume_equivalent(steps=5, split=3, interrupt="crash", crash_points=["first"], timeout=15)
def test_waits_for_torn(resume_equiv):
    resume_equiv.run(crashzoo.train_waits_for_torn, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points=["returned"])
def test_async_pointer_first(resume_equiv):
    resume_equiv.run(crashzoo.train_async_pointer_first, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points=["first", "last"])
def test_dcp_async(resume_equiv):
    resume_equiv.run(crashzoo.train_dcp_async, checkpoint=ROOT)


@resume_equivalent(steps=5, split=3, rng_mutation=False)
def test_staging_race(resume_equiv):
    resume_equiv.run(crashzoo.train_staging_race)
"""


@pytest.mark.long(120)
def test_crash_points(pytester):
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_crashes=TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=3, failed=4)

    atomic = section_of(text, "test_atomic")
    assert "crash at split 4 passed (5 exact)" in atomic, atomic
    for line in [
        "first          rank 0: after torch.save(checkpoints/tmp-step_4/model.pt)",
        "-> EXACT: exact (resumed from step 2)",
        "last, pointer  rank 0: after os.replace(checkpoints/latest.tmp -> checkpoints/latest)",
        "returned       rank 0: after the save returned, at record(step=5)",
        "pointer        rank 0: after writing checkpoints/latest.tmp (closed, before the next file call)",
        "-> EXACT: exact (resumed from step 4)",
    ]:
        assert line in atomic, line
    assert "crash-1: 2 ranks" in atomic and "killed as planned" in atomic

    refuses = section_of(text, "test_refuses")
    assert "-> REFUSED: refused (rank " in refuses  # the rank that exits first
    assert ": refusing to start: checkpoints/tmp-step_3 is an incomplete checkpoint)" in refuses

    strict = section_of(text, "test_refusal_that_must_not_happen")
    assert (
        "first failing point (first): rank 0: after torch.save(checkpoints/tmp-step_3/model.pt)"
        in strict
    )
    assert 'incomplete checkpoint), and crash_refusal="fail"' in strict

    hang = section_of(text, "test_waits_for_torn")
    assert "-> FAILED: hung on the torn checkpoint (rank 0: still running at the timeout " in hang
    assert "(killed); stuck in " in hang and "crashzoo.py:" in hang and " in find)" in hang

    late = section_of(text, "test_async_pointer_first")
    assert "returned  rank 0: after the save returned, at record(step=5)" in late
    # both ranks load the torn checkpoint: either may fail first (the other is then stopped)
    assert re.search(
        r"-> FAILED: crashed on the torn checkpoint \(rank [01]: FileNotFoundError:", late
    )

    # the step-2 save's writes that DCP's thread finishes during steps 3 and 4 are not the
    # step-4 save's first points, and its .metadata, written during step 5, is its last
    dcp = section_of(text, "test_dcp_async")
    assert "crash at split 4 passed (2 exact)" in dcp, dcp
    # the first point is async_save's return or its executor's first write, whichever rank 0
    # logged first: on a loaded machine the executor thread can write before the call returns
    assert (
        "first  rank 0: after torch.distributed.checkpoint.async_save(checkpoints/step_4)" in dcp
        or "first  rank 0: after open(checkpoints/step_4/__0_0.distcp) in thread "
        "AsyncCheckpointExecutor_0"
        in dcp
    ), dcp
    for line in [
        "-> EXACT: exact (resumed from step 2)",
        "last   rank 0: after os.rename(checkpoints/step_4/.metadata.tmp -> "
        "checkpoints/step_4/.metadata) in thread AsyncCheckpointExecutor_0",
        "-> EXACT: exact (resumed from step 4)",
    ]:
        assert line in dcp, line

    race = section_of(text, "test_staging_race")
    assert "likely cause (torn checkpoint): rank 0: the checkpoint at " in race
    assert "was not on disk when the uninterrupted run went on past step 3" in race
    assert (
        "what it restored is the uninterrupted run's state after step 4: its contents are from "
        "a later step than it claims, a staging race"
    ) in race
    assert processes_mentioning(str(pytester.path)) == []


TORN = """
from pytest_resume_equiv import resume_equivalent
import crashzoo

ROOT = "{run_dir}/checkpoints"


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_saved_over_in_place(resume_equiv):
    resume_equiv.run(crashzoo.train_saves_over_in_place, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points="all")
def test_saved_over_by_replace(resume_equiv):
    resume_equiv.run(crashzoo.train_saves_over_by_replace, checkpoint=ROOT)
"""


@pytest.mark.long(40)
def test_killed_inside_a_write(pytester):
    """A torch.save over the one checkpoint file at every save: killed halfway through the
    write (the file cut to half its size), the resume reads a torn file. By default, as a
    crash point inside every write over a file an earlier save left; its control (a
    temporary, fsync, os.replace) passes every point, inside each of its writes too."""
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_torn=TORN)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)

    in_place = section_of(text, "test_saved_over_in_place")
    torn = r"\n  torn +rank 0: inside torch\.save\(checkpoints/ckpt\.pt\): cut to [\d.]+ KiB of "
    assert re.search(torn, in_place), in_place
    assert re.search(
        r"on disk: checkpoints/\{ckpt\.pt [\d.]+ KiB\}\n +-> FAILED: crashed", in_place
    )
    assert re.search(  # the rank that fails first
        r"-> FAILED: crashed on the torn checkpoint \(rank \d: RuntimeError: PytorchStreamReader "
        r"failed reading zip archive: failed finding central directory\)\n",
        in_place,
    ), in_place
    assert "first failing point (torn): rank 0: inside torch.save(checkpoints/ckpt.pt)" in in_place
    cause = re.search(r"likely cause \(written in place\): (.*)", in_place)
    assert cause is not None, in_place
    assert re.search(
        r"the kill inside torch\.save\(checkpoints/ckpt\.pt\) left it cut to [\d.]+ KiB of "
        r"[\d.]+ KiB on disk, over the file the save at step 2 had written there \(the save "
        r"writes in place, so its only copy is torn\), and the resumed run read it: "
        r"torch\.load\(checkpoints/ckpt\.pt\) raised RuntimeError: PytorchStreamReader failed "
        r"reading zip archive: failed finding central directory\. Fix: write the file to a "
        r"temporary path beside it, flush and os\.fsync it, then os\.replace it onto the final "
        r"path",
        cause.group(1),
    ), cause.group(1)
    assert in_place.count("Fix:") == 1

    control = section_of(text, "test_saved_over_by_replace")
    assert "crash at split 4 passed (6 exact)" in control, control
    for line in [
        "torn      rank 0: inside torch.save(checkpoints/ckpt.pt.tmp): cut to ",
        "event 2   rank 0: after os.replace(checkpoints/ckpt.pt.tmp -> checkpoints/ckpt.pt)",
    ]:
        assert line in control, line
    assert processes_mentioning(str(pytester.path)) == []


RESTARTED = """
from pytest_resume_equiv import resume_equivalent
import crashzoo

ROOT = "{run_dir}/checkpoints"


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash")
def test_renames_onto_what_the_crash_left(resume_equiv):
    resume_equiv.run(crashzoo.train_renames_onto_what_the_crash_left, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points=["middle"])
def test_renames_onto_what_the_crash_left_one_root(resume_equiv):
    resume_equiv.run(crashzoo.train_renames_onto_what_the_crash_left_one_root, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points="all")
def test_renames_after_clearing(resume_equiv):
    resume_equiv.run(crashzoo.train_renames_after_clearing, checkpoint=ROOT)
"""


@pytest.mark.long(45)
def test_the_restarted_job_saves_where_it_resumed(pytester):
    """tmp-step_k, fsync, os.replace to step_k, then `latest`: killed after the rename, the
    restarted job resumes from `latest` (step 2), redoes step 4 and cannot rename onto the
    complete step_4 the crash left. Written as users write it first (resume from
    {checkpoint}, save under {run_dir}), the resumed launch used to save into an empty folder
    of its own and pass; it now gets the crash's layout in its own run directory, both forms
    alike. The control removes a step_k the crash left before the rename."""
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_restarted=RESTARTED)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=1, failed=2)

    row = "middle         rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)"
    why = (
        "-> FAILED: the restarted job could not save step 4: os.replace onto the existing "
        "checkpoints/step_4: Directory not empty"
    )
    cause = (
        "likely cause (save blocked by what the crash left): rank 0: the restarted job could "
        "not save step 4: os.replace onto the existing checkpoints/step_4: Directory not empty; "
        "the crash at 'middle' had left checkpoints/step_4 in place: it resumed from step 2, "
        "redid the steps up to 4 and its save cannot write over what the crash left, so every "
        "restart fails the same way. Fix: make a redone save replace what a crash left: "
        "remove an existing step_k (shutil.rmtree) before os.replace(tmp-step_k, step_k)"
    )
    first = section_of(text, "test_renames_onto_what_the_crash_left")
    assert row in first and why in first, first
    assert "first failing point (middle): rank 0: after os.replace(" in first
    assert cause in first and first.count("Fix:") == 1, first
    one_root = section_of(text, "test_renames_onto_what_the_crash_left_one_root")
    assert why in one_root and cause in one_root, one_root

    control = section_of(text, "test_renames_after_clearing")
    assert "crash at split 4 passed (13 exact)" in control, control
    assert (
        "event 4   rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)"
        in control
    )
    assert processes_mentioning(str(pytester.path)) == []


POWER = """
from pytest_resume_equiv import resume_equivalent
import crashzoo

ROOT = "{run_dir}/checkpoints"


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_mode="power")
def test_renames_without_fsync(resume_equiv):
    resume_equiv.run(crashzoo.train_renames_without_fsync, checkpoint=ROOT)


@resume_equivalent(
    steps=6, split=[2, 4], interrupt="crash", crash_mode="power", crash_points=["last"]
)
def test_pointer_not_fsynced(resume_equiv):
    resume_equiv.run(crashzoo.train_pointer_not_fsynced, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_mode="power")
def test_fsynced_then_renamed(resume_equiv):
    resume_equiv.run(crashzoo.train_saves_over_by_replace, checkpoint=ROOT)
"""


@pytest.mark.long(60)
def test_a_power_loss_rolls_back_what_was_not_fsynced(pytester):
    """crash_mode="power": at each point the kill, then every write the crash launch had not
    made durable rolled back. A temporary renamed onto the checkpoint without any fsync
    survives every kill and no power loss; a `latest` renamed without an fsync of its folder
    names, after one, the folder the save then deleted. The control (fsync the file,
    os.replace, fsync the folder) passes every point."""
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_power=POWER)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=1, failed=2)

    unsynced = section_of(text, "test_renames_without_fsync")
    assert "crash at split 4 failed (3 failed)" in unsynced, unsynced
    for line in [
        "first (power)         rank 0: after torch.save(checkpoints/ckpt.pt.tmp), then a "
        "power loss",
        "middle, last (power)  rank 0: after os.replace(checkpoints/ckpt.pt.tmp -> "
        "checkpoints/ckpt.pt), then a power loss",
        "rolled back: checkpoints/ckpt.pt.tmp removed (created at step 2; checkpoints not "
        "fsynced after), os.replace(checkpoints/ckpt.pt.tmp -> checkpoints/ckpt.pt) undone (at "
        "step 2; checkpoints not fsynced after), checkpoints/ckpt.pt.tmp removed (created at "
        "step 4; checkpoints not fsynced after)",
        "on disk: nothing",
        "-> FAILED: started over from step 0: lost the completed checkpoint of step 2",
    ]:
        assert line in unsynced, line
    assert (
        "likely cause (not fsynced): checkpoints/ckpt.pt was renamed into place "
        "(os.replace(checkpoints/ckpt.pt.tmp -> checkpoints/ckpt.pt), in the save at step 2) "
        "without an fsync of its folder checkpoints: after a power loss the rename is undone "
        "and checkpoints/ckpt.pt is gone; the resumed run started over from step 0: lost the "
        "completed checkpoint of step 2 (2 more writes not yet durable were rolled back). Fix: "
        "flush and os.fsync each file before os.replace puts it in place, then os.fsync the "
        "folder the rename (or the file's creation) happened in"
    ) in unsynced, unsynced
    assert unsynced.count("Fix:") == 1

    pointer = section_of(text, "test_pointer_not_fsynced")
    assert (
        "last (power)  rank 0: after shutil.rmtree(checkpoints/step_2), then a power loss"
        in pointer
    ), pointer
    assert (
        "rolled back: checkpoints/latest.tmp removed (created at step 4; checkpoints not fsynced "
        "after), os.replace(checkpoints/latest.tmp -> checkpoints/latest) undone, the file it "
        "replaced back (at step 4; checkpoints not fsynced after)"
    ) in pointer
    assert re.search(
        r"-> FAILED: crashed on the torn checkpoint \(rank \d: FileNotFoundError: \[Errno 2\] "
        r"No such file or directory: 'checkpoints/step_2/model\.pt'\)",
        pointer,
    ), pointer
    assert re.search(
        r"likely cause \(not fsynced\): rank \d: checkpoints/latest was renamed into place "
        r"\(os\.replace\(checkpoints/latest\.tmp -> checkpoints/latest\), in the save at step "
        r"4\) without an fsync of its folder checkpoints: after a power loss the rename is "
        r"undone and checkpoints/latest reads 'step_2' again; the resumed run read it, then "
        r"failed: open\(checkpoints/step_2/model\.pt\) raised FileNotFoundError: \[Errno 2\] No "
        r"such file or directory \(1 more writes not yet durable were rolled back\)\. Fix: "
        r"flush and os\.fsync each file",
        pointer,
    ), pointer

    control = section_of(text, "test_fsynced_then_renamed")
    assert "crash at split 4 passed (4 exact)" in control, control
    for line in [
        "middle (power)    rank 0: after os.replace(checkpoints/ckpt.pt.tmp -> "
        "checkpoints/ckpt.pt), then a power loss",
        "rolled back: checkpoints/ckpt.pt.tmp removed (created at step 4; checkpoints not "
        "fsynced after), os.replace(checkpoints/ckpt.pt.tmp -> checkpoints/ckpt.pt) undone, the "
        "file it replaced back (at step 4; checkpoints not fsynced after)",
        "-> EXACT: exact (resumed from step 2)",
        "rolled back: nothing (every write was durable)",
        "-> EXACT: exact (resumed from step 4)",
    ]:
        assert line in control, line
    assert processes_mentioning(str(pytester.path)) == []


MARKERS = """
from pytest_resume_equiv import resume_equivalent
import crashzoo

ROOT = "{run_dir}/checkpoints"


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points=["last"])
def test_marks_in_place(resume_equiv):
    resume_equiv.run(crashzoo.train_marks_in_place, checkpoint=ROOT)


@resume_equivalent(steps=6, split=[2, 4], interrupt="crash", crash_points=["last"])
def test_marks_by_rename(resume_equiv):
    resume_equiv.run(crashzoo.train_marks_by_rename, checkpoint=ROOT)
"""


@pytest.mark.long(30)
def test_a_marker_written_last_in_place_exists_before_its_content(pytester):
    """step_k's files, then the marker `step` that names the newest, written last but in
    place: killed between its open() and the write, it is left empty and the resume cannot
    parse it, though step_2 is complete on disk. The point is named from what was on disk
    and what the resume read (it used to say 'lost the completed checkpoint of step 2'). The
    control writes the marker by rename."""
    shutil.copy(ZOO, pytester.path / "crashzoo.py")
    pytester.makepyfile(test_markers=MARKERS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:randomly")
    text = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)

    in_place = section_of(text, "test_marks_in_place")
    assert "last  rank 0: after open(checkpoints/step)\n" in in_place, in_place
    assert re.search(r"on disk: checkpoints/\{step 0 B\}, checkpoints/step_2/\{", in_place)
    why = (
        r"-> FAILED: crashed on the empty checkpoints/step \(rank \d: ValueError: invalid "
        r"literal for int\(\) with base 10: ''\)\n"
    )
    assert re.search(why, in_place), in_place
    assert "lost the completed checkpoint" not in in_place
    assert re.search(
        r"likely cause \(marker before its content\): the kill came between open\(\) "
        r"and the write of checkpoints/step \(the save at step 4\), in place over the one the "
        r"save at step 2 had written: it exists, empty \(0 B\), before its content, and the "
        r"resumed run read it: it read checkpoints/step last, then failed: ValueError: invalid "
        r"literal for int\(\) with base 10: ''; the checkpoint of step 2 is on disk "
        r"\(checkpoints/step_2\), but the marker that names it is what the resume reads\. Fix: "
        r"write the marker to a temporary file beside it, then os\.replace it onto the "
        r"marker's name",
        in_place,
    ), in_place
    assert in_place.count("Fix:") == 1

    control = section_of(text, "test_marks_by_rename")
    assert "crash at split 4 passed (1 exact)" in control, control
    assert "last  rank 0: after os.replace(checkpoints/step.tmp -> checkpoints/step)" in control
    assert "-> EXACT: exact (resumed from step 4)" in control
    assert processes_mentioning(str(pytester.path)) == []
