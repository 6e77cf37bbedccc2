"""The cause of a failed power-loss point (`Stage.CRASH`, crash_mode="power"): a write the
saver never made durable, which the rollback of the power loss undid (checks/power_loss.py),
and what the resumed run did with what was left.

The input is the crash point's facts (`at_crash.AfterCrash`): the records of what was rolled
back (a file cut to what its last fsync covered, a created file removed, a rename undone),
what the resumed run's failing rank read and its error, and the point's verdict. The
rolled-back write named is the one the resumed run read (its failing call's file, else the
newest file it read that the rollback touched); when it read none (it started over, or
refused), the first rename the rollback undid, else the first created file, else the first
cut: the oldest write whose loss took the checkpoint with it.
"""

from __future__ import annotations

from typing import Any, Optional

from ..rank.crasher import size_words
from .at_crash import AfterCrash, short
from .classes import NOT_FSYNCED
from .rules import Finding, Rule, Stage


def _touched(record: dict[str, Any]) -> tuple[str, ...]:
    """The names a rolled-back write changed."""
    return tuple(str(record[k]) for k in ("path", "to") if record.get(k))


def _read_back(crash: AfterCrash) -> tuple[Optional[dict[str, Any]], str]:
    """The rolled-back write the resumed run read, and what it did then, in words."""
    failed = crash.failed or {}
    path = failed.get("path")
    call = f"{failed.get('op')}({path}) raised {_error(str(failed.get('error') or crash.message))}"
    for record in crash.rolled_back:
        if path and path in _touched(record):
            return record, f"the resumed run read it: {call}"
    for read in reversed(crash.read):
        for record in crash.rolled_back:
            if read not in _touched(record):
                continue
            if path:
                return record, f"the resumed run read it, then failed: {call}"
            if crash.message:
                return record, f"the resumed run read it, then failed: {_error(crash.message)}"
            return record, "the resumed run read it"
    return None, ""


def undone_by_power_loss(crash: AfterCrash) -> Optional[Finding]:
    """A power-loss point whose rollback undid writes that were not durable (the records
    checks/power_loss.py made): the one the resumed run read (its failing call's file, or the
    newest file it read), else, when it read none, the first rename undone, the first
    created file removed, or the first file cut."""
    if not isinstance(crash, AfterCrash) or not crash.rolled_back:
        return None
    record, then = _read_back(crash)
    if record is None:
        then = f"the resumed run {crash.outcome}" if crash.outcome else ""
        kinds = [[r for r in crash.rolled_back if r["kind"] == k] for k in ("rename", "create")]
        record = next((found[0] for found in kinds if found), crash.rolled_back[0])
    return Finding(
        f"rank {crash.failed.get('rank', 0)}" if crash.failed else "",
        {
            **record,
            "then": then,
            "others": len(crash.rolled_back) - 1,
        },
    )


def _error(text: str) -> str:
    """An error in a cause's words: an OSError without the absolute path it names."""
    text = short(text)
    return text.split(": '", 1)[0] if "[Errno " in text else text


def _written(found: Finding) -> str:
    """What was written and not made durable, and what the power loss left of it."""
    f = found.evidence
    saved = f", in the save at step {f['after_step']}" if f.get("after_step") is not None else ""
    folders = " and ".join(f.get("dirs") or ()) or "its folder"
    if f["kind"] == "rename":
        again = " again" if f.get("restored") else ""
        return (
            f"{f['to']} was renamed into place ({f['op']}({f['path']} -> {f['to']}){saved}) "
            f"without an fsync of its folder {folders}: after a power loss the rename is undone "
            f"and {f['to']} {f.get('now', 'is gone')}{again}"
        )
    if f["kind"] == "create":
        return (
            f"{f['path']} was created ({f['op']}{saved}) and its folder {folders} was not "
            "fsynced after: after a power loss it is gone"
        )
    synced = "written again after its last os.fsync" if f.get("fsynced") else "never fsynced"
    return (
        f"{f['path']} was written ({f['op']}{saved}) and {synced}: after a power loss it is "
        f"cut to {size_words(f['size'])} of {size_words(f['of'])}"
    )


def _power_words(f: Finding) -> str:
    more = f" ({f['others']} more writes not yet durable were rolled back)" if f["others"] else ""
    return f"{_written(f)}; {f['then']}{more}" if f["then"] else f"{_written(f)}{more}"


RULES = (
    Rule(
        "crash.undone-by-power-loss",
        (Stage.CRASH,),
        NOT_FSYNCED,
        undone_by_power_loss,
        _power_words,
        after=(
            "crash.marker-before-its-content",
            "crash.torn-file-written-in-place",
            "crash.torn-file-read",
            "crash.restarted-job-could-not-save",
        ),
    ),
)
