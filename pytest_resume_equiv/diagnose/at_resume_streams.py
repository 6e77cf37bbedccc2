"""The causes of one random stream that differs at the resume point (`Stage.STREAM`), read
with the restore log and the draws traced before the first resumed step."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import GENERATOR, parent_stream, stream_kind
from .classes import (
    DRAWN_AFTER_THE_SAVE,
    NEVER_RESTORED,
    REPLAYED_EPOCH,
    RESTORED_FROM_ANOTHER_RANK,
    RESTORED_WRONG,
    rng_before_iterator,
)
from .draws import base_window, draws_on, shuffles_data
from .replay import replayed_epoch
from .rules import Finding, Rule, Stage
from .stream_restores import RESTORE_RULES, draws_found, ops_words
from .stream_words import how_restored, restore_call, stream_words
from .subject import Subject, point_value

STAGE = (Stage.STREAM,)


def other_rank_saved(s: Subject) -> Optional[Finding]:
    """A value at the resume point that equals another rank's saved state there: this rank
    was restored from that rank's (a file only rank 0 writes holds only rank 0's)."""
    for key in s.keys:
        value = point_value(s.res, key)
        if value is None:
            continue  # nothing restored to equal: another rank saving none is no match
        for other in sorted(s.ev.base_sigs, key=lambda r: (r != 0, r)):
            saved = s.ev.base_sigs[other].resume_point(s.ev.split)
            if other != s.rank and saved is not None and point_value(saved, key) == value:
                return Finding(s.where(), {"key": key, "rank": s.rank, "other": other})
    return None


def _other_rank_words(f: Finding) -> str:
    return (
        f"at the resume point {f['key']} equals rank {f['other']}'s saved state: rank "
        f"{f['rank']} was restored from rank {f['other']}'s"
    )


def derived_from_parent(s: Subject) -> Optional[Finding]:
    """A stream re-derived from another audited stream (the generator a DataLoader's sampler
    seeds from the CPU RNG whenever an iterator starts) differs only because its parent
    differed when it was seeded: the parent is the cause, even where the parent itself matches
    at the resume point (restored after the iterator started)."""
    parent = parent_stream(s.name)
    if parent is None:
        return None
    first = next((d for d in (s.res or {}).get("draws", []) if d.get("stream") == s.name), None)
    return Finding(
        s.where(),
        {
            "stream": s.name,
            "parent": stream_words(parent),
            "how": how_restored(parent),
            "started_at": first["at"] if first else None,
            "parent_differs": point_value(s.base, parent) != point_value(s.res, parent),
            "replay": replayed_epoch(s.ev, s.rank),
        },
    )


def _derived_words(f: Finding) -> str:
    started = f" (its iterator started at {f['started_at']})" if f["started_at"] else ""
    now = (
        "and it still differs at the resume point"
        if f["parent_differs"]
        else "although it matches at the resume point (restored after the iterator started)"
    )
    return (
        (f"{f['replay']}. " if f["replay"] else "")
        + f"{stream_words(f['stream'])} differs at the resume point; it is seeded from "
        f"{f['parent']} when an iterator starts{started}, so {f['parent']} was not the "
        f"uninterrupted run's state there, {now}"
    )


def drawn_after_the_save(s: Subject) -> Optional[Finding]:
    """Restored, and the resumed run draws nothing the uninterrupted run does not, but the
    uninterrupted run drew from the stream after it wrote the checkpoint and before its next
    step (an evaluation, a loader started at the epoch's end): code the resumed run does not
    run there. The restore was right; the two runs hold different states at the resume
    point because of that code (read from the saving run's file events)."""
    saved_at = s.ev.saved_at(s.rank)
    if not s.restores or not saved_at:
        return None
    after_save = draws_on(base_window(s), s.name, since_ns=saved_at)
    made = draws_on(s.res, s.name, s.last_restore)
    # draws the resumed run made at all, even before its restore (restored too late)
    missing = after_save - draws_on(s.res, s.name)
    if not missing or made - after_save:
        return None
    return Finding(s.where(), draws_found(s, missing))


def _after_save_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was restored ({f['restore']} at {f['restored_at']}), and "
        f"the resumed run makes no draw the uninterrupted run does not, but the uninterrupted "
        f"run drew from it after it wrote the checkpoint and before its next step ({ops_words(f)}), in "
        "code the resumed run does not run there (an evaluation, a loader started at the "
        "epoch's end): the restore was right, that code moved the stream"
    )


def _never(s: Subject) -> dict:
    return {"stream": s.name, "call": restore_call(s.name), "how": how_restored(s.name)}


def never_restored_replaying(s: Subject) -> Optional[Finding]:
    """A generator that shuffles the data and was never restored, while the data shows the
    resumed epoch consuming an earlier epoch's samples in order."""
    if s.restores or stream_kind(s.name) != GENERATOR or not shuffles_data(s):
        return None
    replay = replayed_epoch(s.ev, s.rank)
    return Finding(s.where(), {**_never(s), "replay": replay}) if replay else None


def _never_replaying_words(f: Finding) -> str:
    return (
        f"{f['replay']}: {stream_words(f['stream'])} shuffles the data and was never restored "
        f"(no {f['call']} call for it after the checkpoint was read), so the resumed epoch "
        "draws the permutation of the first one"
    )


def never_restored(s: Subject) -> Optional[Finding]:
    """No call restored the stream after the checkpoint was read."""
    return None if s.restores else Finding(s.where(), _never(s))


def _never_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was never restored (no {f['call']} call for it after the "
        "checkpoint was read) and differs at the resume point"
    )


def restored_wrong(s: Subject) -> Optional[Finding]:
    """Restored, with no extra draw in between, and still not the uninterrupted run's state:
    the saved state is not the one at the split."""
    restore = s.restores[-1]
    return Finding(
        s.where(), {"stream": s.name, "restore": restore["call"], "restored_at": restore["at"]}
    )


def _restored_wrong_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was restored ({f['restore']} at {f['restored_at']}) but "
        "differs from the uninterrupted run's at the resume point, with no extra draw in "
        "between: the saved state is not the one at the split"
    )


ID = "resume.stream."
FROM_OTHER_RANK = ID + "from-another-rank"
DERIVED = ID + "derived-from-parent"
NEVER_REPLAYING = ID + "never-restored-replaying-an-epoch"
RULES = (
    Rule(FROM_OTHER_RANK, STAGE, RESTORED_FROM_ANOTHER_RANK, other_rank_saved, _other_rank_words),
    Rule(
        DERIVED,
        STAGE,
        rng_before_iterator("cpu"),
        derived_from_parent,
        _derived_words,
        after=(FROM_OTHER_RANK,),
    ),
    *RESTORE_RULES,
    Rule(
        NEVER_REPLAYING,
        STAGE,
        REPLAYED_EPOCH,
        never_restored_replaying,
        _never_replaying_words,
        after=(DERIVED,),
    ),
    Rule(
        ID + "never-restored",
        STAGE,
        NEVER_RESTORED,
        never_restored,
        _never_words,
        (NEVER_REPLAYING,),
    ),
    Rule(
        ID + "drawn-after-the-save",
        STAGE,
        DRAWN_AFTER_THE_SAVE,
        drawn_after_the_save,
        _after_save_words,
        after=(
            ID + "restored-then-advanced",
            ID + "restored-to-an-earlier-state",
            ID + "restored-too-late",
        ),
    ),
    Rule(
        ID + "restored-wrong",
        STAGE,
        RESTORED_WRONG,
        restored_wrong,
        _restored_wrong_words,
        always=True,
    ),
)
"""The causes of a stream that differs at the resume point; `restored-wrong` is the last word."""
