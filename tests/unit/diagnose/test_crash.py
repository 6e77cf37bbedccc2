"""Stage.CRASH from what a crash left on disk and what the resumed run did with it
(diagnose/at_crash.py): a file the kill cut halfway through its write that the resume read,
written in place or new; the catch-all of at_check.py answers the rest."""

import dataclasses

from pytest_resume_equiv.diagnose import Stage, cause
from pytest_resume_equiv.diagnose.at_crash import AfterCrash

from .builders import fires, look_alike, named

IN_PLACE = "crash.torn-file-written-in-place"
TORN_READ = "crash.torn-file-read"
CATCH_ALL = "crash.torn-by-the-crash"

ZIP_ERROR = (
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
    "directory. This is an internal miniz error. If you are seeing this error, there is a high "
    "likelihood that your checkpoint file is corrupted."
)
WHERE = "rank 0: inside torch.save(checkpoints/ckpt.pt): cut to 1.3 KiB of 2.6 KiB, then killed"


def torn(path="checkpoints/ckpt.pt", overwrites=2, op="torch.save"):
    return {"path": path, "size": 1331, "of": 2662, "op": op, "overwrites": overwrites}


def load_failed(path="checkpoints/ckpt.pt", op="torch.load", error=ZIP_ERROR):
    return {"op": op, "path": path, "after_step": None, "error": error, "rank": 1}


def crash(**facts):
    return AfterCrash("torn", WHERE, **{"message": ZIP_ERROR, **facts})


@fires(IN_PLACE)
@look_alike(CATCH_ALL, wins=IN_PLACE)
def test_a_file_cut_by_the_kill_over_an_earlier_save_and_read_back_was_written_in_place():
    d = cause(Stage.CRASH, crash(torn=torn(), failed=load_failed()))
    named(
        d,
        IN_PLACE,
        "written in place",
        "rank 1: the kill inside torch.save(checkpoints/ckpt.pt) left it cut to 1.3 KiB of "
        "2.6 KiB on disk, over the file the save at step 2 had written there (the save writes "
        "in place, so its only copy is torn), and the resumed run read it: "
        "torch.load(checkpoints/ckpt.pt) raised RuntimeError: PytorchStreamReader failed "
        "reading zip archive: failed finding central directory",
        "write the file to a temporary path beside it, flush and os.fsync it, then os.replace",
    )
    assert "This is an internal miniz error" not in d.cause  # torch's advice, left out


@fires(TORN_READ)
@look_alike(IN_PLACE, wins=TORN_READ)
def test_a_new_file_cut_by_the_kill_and_read_back_is_a_checkpoint_taken_before_complete():
    """A file the save created (no earlier save had written that path): no copy of the
    step before was lost, the resume took a checkpoint that was still being written."""
    marker = torn("checkpoints/step_4/meta.json", overwrites=None, op="open")
    parser = "JSONDecodeError: Unterminated string starting at: line 1 column 2 (char 1)"
    d = cause(
        Stage.CRASH,
        crash(torn=marker, read=("checkpoints/step_4/model.pt", marker["path"]), message=parser),
    )
    named(
        d,
        TORN_READ,
        "torn checkpoint",
        "the kill inside open(checkpoints/step_4/meta.json) left it cut to 1.3 KiB of 2.6 KiB on "
        "disk, a checkpoint still being written, and the resumed run read it as a complete one: "
        "it read checkpoints/step_4/meta.json last, then failed: JSONDecodeError: Unterminated",
        "write each checkpoint into a temporary folder and rename it once complete",
    )


@look_alike(TORN_READ, wins=CATCH_ALL)
def test_a_torn_file_the_resume_did_not_read_is_not_blamed():
    """The kill cut a file, yet the resume failed on another one, or read the torn one but
    not last, or only wrote it: the crash is to blame, not that file."""
    elsewhere = load_failed(path="checkpoints/optim.pt")
    written = {**load_failed(), "op": "open", "mode": "wb"}
    for facts in (
        {"torn": torn(), "failed": elsewhere},
        {"torn": torn(), "read": ("checkpoints/ckpt.pt", "checkpoints/latest")},
        {"torn": torn(), "failed": written},
        {"torn": None, "failed": load_failed()},
    ):
        d = cause(Stage.CRASH, crash(**facts))
        assert d is not None and d.rule == CATCH_ALL, (facts, d and d.rule)


# A restarted job's own save


SAVE_BLOCKED = "crash.restarted-job-could-not-save"


def replace_failed(after_step=4):
    return {
        "op": "os.replace",
        "path": "checkpoints/tmp-step_4",
        "to": "checkpoints/step_4",
        "after_step": after_step,
        "error": "OSError: [Errno 39] Directory not empty: '/r/tmp-step_4' -> '/r/step_4'",
        "rank": 0,
    }


LEFT = ("checkpoints", "checkpoints/latest", "checkpoints/step_2", "checkpoints/step_4")


@fires(SAVE_BLOCKED)
def test_a_resumed_run_whose_redone_save_cannot_replace_what_the_crash_left_is_blocked():
    middle = "rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)"
    facts = AfterCrash("middle", middle, failed=replace_failed(), resumed_from=2, on_disk=LEFT)
    named(
        cause(Stage.CRASH, facts),
        SAVE_BLOCKED,
        "save blocked by what the crash left",
        "rank 0: the restarted job could not save step 4: os.replace onto the existing "
        "checkpoints/step_4: Directory not empty; the crash at 'middle' had left "
        "checkpoints/step_4 in place: it resumed from step 2, redid the steps up to 4 and its "
        "save cannot write over what the crash left, so every restart fails the same way",
        "remove an existing step_k (shutil.rmtree) before os.replace(tmp-step_k, step_k)",
    )


@look_alike(SAVE_BLOCKED, wins=CATCH_ALL)
def test_a_write_that_fails_before_the_resumed_run_trained_is_no_save_of_its_own():
    """Clearing what the crash left before the first resumed step (after_step 2, where it
    resumed from), or a file opened for reading: the crash, not a save, is to blame."""
    read = {**load_failed("checkpoints/latest", op="open"), "mode": "r"}
    for failed in (replace_failed(after_step=2), read):
        facts = AfterCrash("middle", "x", failed=failed, resumed_from=2, on_disk=LEFT)
        d = cause(Stage.CRASH, facts)
        assert d is not None and d.rule == CATCH_ALL, (failed, d and d.rule)


# A marker opened, not yet written (issue 43, point 4)


MARKER = "crash.marker-before-its-content"
INT_ERROR = "ValueError: invalid literal for int() with base 10: ''"
MARKER_LEFT = (
    "checkpoints",
    "checkpoints/step",
    "checkpoints/step_2",
    "checkpoints/step_2/model.pt",
)


def marker_killed(**facts):
    """Killed right after open(checkpoints/step, "w") of the save at step 4, over the marker
    the save at step 2 wrote: it is left empty, and the resume parses it."""
    opened = {"op": "open", "path": "checkpoints/step", "after_step": 4, "overwrites": 2}
    return AfterCrash(
        "last",
        "rank 0: after open(checkpoints/step)",
        **{
            "killed_at": opened,
            "empty": ("checkpoints/step",),
            "read": ("checkpoints/step",),
            "message": INT_ERROR,
            "completed": (2,),
            "on_disk": MARKER_LEFT,
            "outcome": "crashed on the empty checkpoints/step (rank 0: " + INT_ERROR + ")",
            **facts,
        },
    )


@fires(MARKER)
def test_a_marker_the_kill_left_opened_and_empty_that_the_resume_read_exists_before_its_content():
    named(
        cause(Stage.CRASH, marker_killed()),
        MARKER,
        "marker before its content",
        "the kill came between open() and the write of checkpoints/step (the save at step 4), "
        "in place over the one the save at step 2 had written: it exists, empty (0 B), before "
        "its content, and the resumed run read it: it read checkpoints/step last, then failed: "
        "ValueError: invalid literal for int() with base 10: ''; the checkpoint of step 2 is on "
        "disk (checkpoints/step_2), but the marker that names it is what the resume reads",
        "write the marker to a temporary file beside it, then os.replace it onto the marker's",
    )


@look_alike(MARKER, wins=IN_PLACE)
def test_a_marker_the_kill_cut_inside_its_write_is_a_torn_file_written_in_place():
    cut = torn("checkpoints/step", overwrites=2, op="open")
    d = cause(Stage.CRASH, marker_killed(torn=cut))
    assert d is not None and d.rule == IN_PLACE, d and d.rule


@look_alike(MARKER, wins=CATCH_ALL)
def test_an_empty_file_the_resume_did_not_read_last_or_one_written_whole_is_no_empty_marker():
    for facts in (
        {"read": ("checkpoints/step", "checkpoints/step_2/model.pt")},
        {"failed": load_failed("checkpoints/step_2/model.pt")},
        {"empty": ()},
        {"killed_at": {"op": "os.replace", "path": "checkpoints/step.tmp"}},
    ):
        d = cause(Stage.CRASH, marker_killed(**facts))
        assert d is not None and d.rule == CATCH_ALL, (facts, d and d.rule)


EMPTY_LOADED = "crash.empty-checkpoint-file-loaded"


@fires(EMPTY_LOADED)
@look_alike(MARKER, wins=EMPTY_LOADED)
def test_an_empty_file_the_resume_loaded_as_a_checkpoint_is_written_in_place_not_a_marker():
    """Lightning's last.ckpt, moved across file systems (copied onto its final path): the
    kill after its open() leaves the checkpoint itself empty, and torch.load raises."""
    opened = {"op": "open", "path": "checkpoints/last.ckpt", "after_step": 4, "overwrites": 2}
    d = cause(
        Stage.CRASH,
        marker_killed(
            killed_at=opened,
            empty=("checkpoints/last.ckpt",),
            read=("checkpoints/last.ckpt",),
            failed=load_failed("checkpoints/last.ckpt", error="EOFError: "),
            message="EOFError: ",
        ),
    )
    named(
        d,
        EMPTY_LOADED,
        "written in place",
        "the kill came between open() and the write of checkpoints/last.ckpt (the save at step "
        "4), in place over the one the save at step 2 had written: the checkpoint file itself, "
        "written straight onto its final path (a copy, or an open of it), exists empty (0 B) "
        "before its content, and the resumed run loaded it: torch.load(checkpoints/last.ckpt) "
        "raised EOFError",
        "write the file to a temporary path beside it, flush and os.fsync it, then os.replace",
    )


@look_alike(EMPTY_LOADED, wins=MARKER)
def test_an_empty_marker_the_resume_parsed_is_no_checkpoint_file():
    d = cause(Stage.CRASH, marker_killed())
    assert d is not None and d.rule == MARKER, d and d.rule


# A power loss (crash_mode="power")


POWER = "crash.undone-by-power-loss"


def rolled(kind, path, after_step=4, **more):
    return {
        "kind": kind,
        "op": more.pop("op", "open"),
        "path": path,
        "after_step": after_step,
        "dirs": ["checkpoints"],
        **more,
    }


POINTER_BACK = rolled(
    "rename",
    "checkpoints/latest.tmp",
    op="os.replace",
    to="checkpoints/latest",
    restored=True,
    now="reads 'step_2'",
)


@fires(POWER)
def test_a_pointer_whose_rename_a_power_loss_undid_names_the_step_the_save_deleted():
    missing = {
        **load_failed("checkpoints/step_2/model.pt", op="open"),
        "mode": "rb",
        "error": "FileNotFoundError: [Errno 2] No such file or directory: '/r/step_2/model.pt'",
        "rank": 0,
    }
    facts = AfterCrash(
        "last (power)",
        "rank 0: after shutil.rmtree(checkpoints/step_2), then a power loss",
        failed=missing,
        read=("checkpoints/latest",),
        rolled_back=(POINTER_BACK, rolled("create", "checkpoints/latest.tmp")),
    )
    named(
        cause(Stage.CRASH, facts),
        POWER,
        "not fsynced",
        "rank 0: checkpoints/latest was renamed into place (os.replace(checkpoints/latest.tmp "
        "-> checkpoints/latest), in the save at step 4) without an fsync of its folder "
        "checkpoints: after a power loss the rename is undone and checkpoints/latest reads "
        "'step_2' again; the resumed run read it, then failed: open(checkpoints/step_2/model.pt) "
        "raised FileNotFoundError: [Errno 2] No such file or directory (1 more writes not yet "
        "durable were rolled back)",
        "flush and os.fsync each file before os.replace puts it in place, then os.fsync the folder",
    )


@fires(POWER)
def test_a_checkpoint_a_power_loss_took_away_is_named_by_its_first_rename_undone():
    """The resumed run read nothing the rollback touched: it started over."""
    facts = AfterCrash(
        "first (power)",
        "x",
        outcome="started over from step 0: lost the completed checkpoint of step 2",
        rolled_back=(
            rolled("create", "checkpoints/ckpt.tmp", after_step=2),
            rolled(
                "rename",
                "checkpoints/ckpt.tmp",
                2,
                op="os.replace",
                to="checkpoints/ckpt",
                now="is gone",
            ),
            rolled("cut", "checkpoints/ckpt.tmp", size=0, of=1331, fsynced=False),
        ),
    )
    named(
        cause(Stage.CRASH, facts),
        POWER,
        "not fsynced",
        "checkpoints/ckpt was renamed into place (os.replace(checkpoints/ckpt.tmp -> "
        "checkpoints/ckpt), in the save at step 2) without an fsync of its folder checkpoints: "
        "after a power loss the rename is undone and checkpoints/ckpt is gone; the resumed run "
        "started over from step 0: lost the completed checkpoint of step 2 (2 more writes",
        "os.fsync",
    )
    only_cut = dataclasses.replace(facts, rolled_back=facts.rolled_back[2:])
    named(
        cause(Stage.CRASH, only_cut),
        POWER,
        "not fsynced",
        "checkpoints/ckpt.tmp was written (open, in the save at step 4) and never fsynced: "
        "after a power loss it is cut to 0 B of 1.3 KiB; the resumed run started over",
        "os.fsync",
    )


@look_alike(POWER, wins=MARKER)
def test_a_power_loss_at_a_marker_opened_and_empty_is_the_marker_before_its_content():
    cut = rolled("cut", "checkpoints/step", size=0, of=1, fsynced=False)
    d = cause(Stage.CRASH, marker_killed(rolled_back=(cut,)))
    assert d is not None and d.rule == MARKER, d and d.rule


@look_alike(POWER, wins=CATCH_ALL)
def test_a_kill_with_nothing_rolled_back_is_no_power_loss():
    d = cause(Stage.CRASH, crash(failed=load_failed(), rolled_back=()))
    assert d is not None and d.rule == CATCH_ALL, d and d.rule
