"""The causes of a failed crash point read from what the crash left on disk and what the
resumed run did with it (`Stage.CRASH`, asked before the catch-all of at_check.py): a file
the kill cut halfway through its write that the resume then read, written in place over the
checkpoint it would resume from or written new; a marker the kill left opened and empty
that the resume then read; and a restarted job that could not save into what the crash left.
A power loss's rollback has its own rule (at_power_loss.py).

The input (`AfterCrash`) holds facts only: the file the crash launch cut (its crash record),
and what the first failing rank of the resumed launch said in its status file (the watched
call its exception came out of, the files it read last). Paths are relative to the run
directory, where the crash and resumed launches lay out the same files.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..rank.crasher import size_words
from .at_check import CrashedAt
from .classes import (
    MARKER_BEFORE_ITS_CONTENT,
    SAVE_BLOCKED_BY_THE_CRASH,
    TORN_CHECKPOINT,
    WRITTEN_IN_PLACE,
)
from .rules import Finding, Rule, Stage

WRITE_CALLS = (
    "open",
    "torch.save",
    "safetensors.torch.save_file",
    "os.replace",
    "os.rename",
    "os.link",
    "os.symlink",
    "os.unlink",
    "os.remove",
    "os.rmdir",
    "shutil.rmtree",
    "os.fsync",
    "torch.distributed.checkpoint.save",
    "torch.distributed.checkpoint.async_save",
)
"""The watched calls that write: one of them failing in the resumed run is a save failing."""
SENTENCE_END = re.compile(r"(?<!\.)\. (?=[A-Z])")


@dataclass(frozen=True)
class AfterCrash(CrashedAt):
    """A crash point's facts: where it was killed (`point`, `where`), the file the kill cut
    (`torn`: `path`, `size`, `of`, `op`, and `overwrites`, the step whose file it wrote over
    in place, None for a new file), the resumed run's failed call (`failed`: `op`, `path`,
    `to`, `mode`, `error`, `after_step`, `rank`), the files that rank read last (`read`),
    its error (`message`) and the step it resumed from (`resumed_from`)."""

    torn: Optional[dict[str, Any]] = None
    failed: Optional[dict[str, Any]] = None
    read: tuple[str, ...] = ()
    message: str = ""
    resumed_from: Optional[int] = None
    on_disk: tuple[str, ...] = ()
    """Paths the crash left (relative, folders too), for what a failed save ran into."""
    killed_at: Optional[dict[str, Any]] = None
    """The event the kill came at (the crash record's: `op`, `path`, `after_step`, and
    `overwrites`, the step whose file it wrote over in place, None for a new file)."""
    empty: tuple[str, ...] = ()
    """The files the crash left empty (0 B)."""
    rolled_back: tuple[dict[str, Any], ...] = ()
    """A power-loss point: the writes not yet durable its rollback undid, in the order they
    were made (checks/power_loss.py: `kind` "cut", "create" or "rename", `op`, `path`,
    `to`, `after_step`, `dirs` not fsynced, `size` and `of` of a cut, what a renamed name
    holds `now`, and whether the file a rename replaced was `restored`)."""
    completed: tuple[int, ...] = ()
    """The steps whose save had completed before the crash."""
    outcome: str = ""
    """The point's verdict, as its row says it."""
    preempted: Optional[dict[str, Any]] = None
    """A preempt point (crash_mode="preempt"): what the SIGTERM and its grace did
    (checks/preemption.py `Preempted.facts`: `grace`, `sigterm`, `killed`, `exited_s`, the
    handler's writes `saved` and the step they hold `saved_step`, `mid_step`,
    `completed_save`, and per killed rank its `last` file event and where it was `stuck`)."""


def _read_torn(crash: AfterCrash) -> Optional[dict[str, Any]]:
    """The torn file's facts when the resumed run read it: its failing call was on that
    file, or, failing elsewhere (a parser after `open`), that file is the last it read."""
    if not isinstance(crash, AfterCrash) or not crash.torn:
        return None  # where and when only (at_check.CrashedAt): the catch-all's
    path = crash.torn["path"]
    torn = {
        **crash.torn,
        "size_words": size_words(int(crash.torn.get("size", 0))),
        "of_words": size_words(int(crash.torn.get("of", 0))),
    }
    how = how_read(crash, path)
    return {**torn, "how": how} if how else None


def how_read(crash: AfterCrash, path: str) -> str:
    """How the resumed run read `path` and failed: its failing call was a read of it, or,
    failing elsewhere (a parser after `open`), it is the last file it read; "" else."""
    failed = crash.failed or {}
    if failed.get("path") == path and failed.get("op") not in WRITE_CALLS[1:]:
        mode = failed.get("mode", "r")
        if failed.get("op") != "open" or not set("wax+") & set(mode):
            return f"{failed['op']}({path}) raised {short(failed.get('error') or crash.message)}"
    if not failed.get("path") and crash.read and crash.read[-1] == path:
        return f"it read {path} last, then failed: {short(crash.message)}"
    return ""


def short(error: str, limit: int = 120) -> str:
    """An error's first sentence when it is long (torch's advice after a zip error)."""
    error = error.strip()
    end = SENTENCE_END.search(error)
    if len(error) > limit and end is not None:
        error = error[: end.start()]
    return error.rstrip(".")


def torn_in_place(crash: AfterCrash) -> Optional[Finding]:
    """The kill came halfway through writing a file that held an earlier save's data at the
    same path (the crash record says which file it cut, and to what size; the uninterrupted
    run's events, that the path had been written before and was still there), and the
    resumed run read that file: its failing call was on it, or it was the last file it read."""
    found = _read_torn(crash)
    if found is None or found.get("overwrites") is None:
        return None
    return Finding(f"rank {crash.failed.get('rank', 0)}" if crash.failed else "", found)


def _cut(f: Finding) -> str:
    return (
        f"the kill inside {f['op']}({f['path']}) left it cut to {f['size_words']} of "
        f"{f['of_words']}"
    )


def _in_place_words(f: Finding) -> str:
    return (
        f"{_cut(f)} on disk, over the file the save at step {f['overwrites']} had written "
        f"there (the save writes in place, so its only copy is torn), and the resumed run "
        f"read it: {f['how']}"
    )


def torn_read(crash: AfterCrash) -> Optional[Finding]:
    """The kill came halfway through writing a new file of a checkpoint (the crash record
    says which, and to what size), and the resumed run read it: it took a checkpoint that was
    still being written for a complete one."""
    found = _read_torn(crash)
    if found is None:
        return None
    return Finding(f"rank {crash.failed.get('rank', 0)}" if crash.failed else "", found, "crash")


def _torn_read_words(f: Finding) -> str:
    return (
        f"{_cut(f)} on disk, a checkpoint still being written, and the resumed run read it "
        f"as a complete one: {f['how']}"
    )


LOADERS = ("torch.load", "safetensors.torch.load_file")
"""The calls that load a checkpoint file itself (not a marker that names one)."""


def _loaded(crash: AfterCrash, path: str) -> bool:
    """The resumed run's failing call loaded `path` as a checkpoint."""
    failed = crash.failed or {}
    return failed.get("path") == path and failed.get("op") in LOADERS


def marker_before_content(crash: AfterCrash) -> Optional[Finding]:
    """The kill came right after the save opened a file for writing (the crash record's
    event is that `open`), the crash left the file empty, and the resumed run read it and
    failed (its failing call was on it, or it read it last): a marker that exists before
    its content. The checkpoint of the newest completed step is named where the crash left
    a folder of that step. A file the resume loaded as a checkpoint is no marker
    (`empty_file_loaded`)."""
    found = _empty_and_read(crash)
    if found is None or _loaded(crash, found["path"]):
        return None
    return found


def empty_file_loaded(crash: AfterCrash) -> Optional[Finding]:
    """The same kill, and the file the crash left empty is the checkpoint itself: the
    resumed run loaded it (`torch.load`, safetensors) and failed. It was written in place
    (a copy onto the final path, an `open` of it), so it exists before its content."""
    found = _empty_and_read(crash)
    if found is None or not _loaded(crash, found["path"]):
        return None
    return found


def _empty_and_read(crash: AfterCrash) -> Optional[Finding]:
    event = crash.killed_at if isinstance(crash, AfterCrash) else None
    if not event or event.get("op") != "open" or event.get("path") not in crash.empty:
        return None
    path = str(event["path"])
    how = how_read(crash, path)
    if not how:
        return None
    newest = max(crash.completed, default=None)
    return Finding(
        f"rank {crash.failed.get('rank', 0)}" if crash.failed else "",
        {
            "path": path,
            "how": how,
            "step": event.get("after_step"),
            "overwrites": event.get("overwrites"),
            "completed": newest,
            "there": _folder_of_step(crash.on_disk, newest) if newest is not None else "",
        },
    )


def _folder_of_step(paths: tuple[str, ...], step: int) -> str:
    """The shortest path the crash left whose name carries the number `step`
    (`checkpoints/step_2`), or ""."""
    number = re.compile(rf"(?<![0-9]){step}(?![0-9])")
    found = [p for p in paths if number.search(p.rsplit("/", 1)[-1])]
    return min(found, key=len) if found else ""


def _killed_after_open(f: Finding) -> str:
    """`the kill came between open() and the write of checkpoints/step (the save at step 4),
    in place over the one the save at step 2 had written`."""
    place = (
        f", in place over the one the save at step {f['overwrites']} had written"
        if f["overwrites"] is not None
        else ""
    )
    saved = f" (the save at step {f['step']})" if f["step"] is not None else ""
    return f"the kill came between open() and the write of {f['path']}{saved}{place}"


def _marker_words(f: Finding) -> str:
    there = ""
    if f["completed"] is not None:
        on = f" is on disk ({f['there']})" if f["there"] else " had completed"
        there = f"; the checkpoint of step {f['completed']}{on}, but the marker that names it"
        there += " is what the resume reads"
    return (
        f"{_killed_after_open(f)}: it exists, empty (0 B), before its content, and the "
        f"resumed run read it: {f['how']}{there}"
    )


def _empty_file_words(f: Finding) -> str:
    return (
        f"{_killed_after_open(f)}: the checkpoint file itself, written straight onto its final "
        f"path (a copy, or an open of it), exists empty (0 B) before its content, and the "
        f"resumed run loaded it: {f['how']}"
    )


def save_blocked(crash: AfterCrash) -> Optional[Finding]:
    """The resumed run loaded what the crash left, trained on, and a call of its own save
    failed (its status names the watched write call its exception came out of, after a step
    later than the one it resumed from): the restarted job cannot save into what the crash
    left, e.g. `os.replace` onto a complete `step_k` the crash had renamed into place."""
    failed = crash.failed if isinstance(crash, AfterCrash) else None
    if not failed or failed.get("op") not in WRITE_CALLS or failed.get("after_step") is None:
        return None
    if failed.get("op") == "open" and not set("wax+") & set(failed.get("mode", "r")):
        return None
    step = int(failed["after_step"])
    if crash.resumed_from is not None and step <= crash.resumed_from:
        return None  # before it trained: a refusal or a clean-up, not its save
    onto = failed.get("to") or failed.get("path")
    return Finding(
        f"rank {failed.get('rank', 0)}",
        {
            "step": step,
            "call": saving_words(failed),
            "onto": onto if onto in crash.on_disk else "",
            "resumed_from": crash.resumed_from,
            "point": crash.point,
        },
    )


def saving_words(failed: dict[str, Any]) -> str:
    """`os.replace onto the existing checkpoints/step_4: Directory not empty`."""
    error = str(failed.get("error", ""))
    number = re.search(r"\[Errno (\d+)\] ", error)
    reason = error[number.end() :] if number else error
    reason = reason.split(": '", 1)[0]
    if failed.get("to"):
        there = number is not None and int(number.group(1)) in (errno.ENOTEMPTY, errno.EEXIST)
        return f"{failed['op']} onto {'the existing ' * there}{failed['to']}: {reason}"
    return f"{failed['op']}({failed.get('path', '')}): {reason}"


def _blocked_words(f: Finding) -> str:
    left = f"; the crash at '{f['point']}' had left {f['onto']} in place" if f["onto"] else ""
    since = (
        f"it resumed from step {f['resumed_from']}, redid the steps up to {f['step']} and "
        if f["resumed_from"] is not None
        else ""
    )
    return (
        f"the restarted job could not save step {f['step']}: {f['call']}{left}: {since}its "
        "save cannot write over what the crash left, so every restart fails the same way"
    )


RULES = (
    Rule(
        "crash.torn-file-written-in-place",
        (Stage.CRASH,),
        WRITTEN_IN_PLACE,
        torn_in_place,
        _in_place_words,
    ),
    Rule(
        "crash.torn-file-read",
        (Stage.CRASH,),
        TORN_CHECKPOINT,
        torn_read,
        _torn_read_words,
        after=("crash.torn-file-written-in-place",),
    ),
    Rule(
        "crash.empty-checkpoint-file-loaded",
        (Stage.CRASH,),
        WRITTEN_IN_PLACE,
        empty_file_loaded,
        _empty_file_words,
        after=("crash.torn-file-written-in-place", "crash.torn-file-read"),
    ),
    Rule(
        "crash.marker-before-its-content",
        (Stage.CRASH,),
        MARKER_BEFORE_ITS_CONTENT,
        marker_before_content,
        _marker_words,
        after=("crash.torn-file-written-in-place", "crash.torn-file-read"),
    ),
    Rule(
        "crash.restarted-job-could-not-save",
        (Stage.CRASH,),
        SAVE_BLOCKED_BY_THE_CRASH,
        save_blocked,
        _blocked_words,
    ),
)
