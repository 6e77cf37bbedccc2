"""The causes of a stream that was restored and still differs at the resume point
(`Stage.STREAM`): seeded again after the load, drawn from after the restore (code the
uninterrupted run ran before its save, a restore to an earlier state, other draws), or drawn
from before it was restored. Each is read from the restore log and the draws traced."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ..rank.layout import GENERATOR, stream_kind
from .classes import (
    NEVER_RESTORED,
    REPEATED_BEFORE_THE_RESUME,
    REPLAYED_EPOCH,
    RESEEDED_AFTER_LOADING,
    RESTORED_THEN_ADVANCED,
    RESTORED_TO_AN_EARLIER_STATE,
    RESTORED_TOO_LATE,
)
from .draws import advance_fixes, base_window, draws_on, shuffles_data
from .replay import replayed_epoch
from .rules import Finding, Rule, Stage
from .stream_words import how_restored, stream_words
from .subject import Subject, point_value

STAGE = (Stage.STREAM,)


def _reseed(s: Subject) -> dict:
    call = s.reseeds[-1]
    return {"stream": s.name, "call": call["call"], "at": call["at"], "how": how_restored(s.name)}


def reseeded_replaying(s: Subject) -> Optional[Finding]:
    """A generator that shuffles the data, seeded again after the checkpoint was read, while
    the data shows the resumed epoch consuming an earlier epoch's samples in order."""
    if not s.reseeds or stream_kind(s.name) != GENERATOR or not shuffles_data(s):
        return None
    replay = replayed_epoch(s.ev, s.rank)
    return Finding(s.where(), {**_reseed(s), "replay": replay}) if replay else None


def _reseeded_replaying_words(f: Finding) -> str:
    return (
        f"{f['replay']}: {stream_words(f['stream'])} shuffles the data and was seeded again "
        f"after the checkpoint was read ({f['call']} at {f['at']}), so the resumed epoch draws "
        "the permutation of the first one"
    )


def generator_built_after_load(s: Subject) -> Optional[Finding]:
    """A generator made and seeded only after the checkpoint was read (whatever owns it
    seeds it when it is built) and never given its saved state."""
    if not s.reseeds or stream_kind(s.name) != GENERATOR:
        return None
    if s.before_resume or len(s.restores) != 1:
        return None
    return Finding(s.where(), _reseed(s))


def _built_after_load_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was made and seeded after the checkpoint was read "
        f"({f['call']} at {f['at']}) and never given its saved state: whatever owns it seeds "
        "it when it is built"
    )


def reseeded(s: Subject) -> Optional[Finding]:
    """A stream seeded again after the checkpoint was read: the seeding replaces the
    restored state."""
    return Finding(s.where(), _reseed(s)) if s.reseeds else None


def _reseeded_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was seeded again after the checkpoint was read "
        f"({f['call']} at {f['at']}), which replaces the restored state"
    )


def _extra_draws(s: Subject) -> Optional[tuple[Counter, Counter]]:
    """The draws the resumed run made after its last restore that the uninterrupted run
    does not make after its save, and the draws the uninterrupted run made before its save."""
    if not s.restores:
        return None
    saved_at = s.ev.saved_at(s.rank)
    base_point = base_window(s)
    base = draws_on(base_point, s.name)
    after_save = draws_on(base_point, s.name, since_ns=saved_at) if saved_at else base
    extra = draws_on(s.res, s.name, s.last_restore) - after_save
    if not extra:
        return None
    return extra, (base - after_save if saved_at else Counter())


def draws_found(s: Subject, extra: Counter) -> dict:
    restore = s.restores[-1]
    return {
        "stream": s.name,
        "restore": restore["call"],
        "restored_at": restore["at"],
        "draws": sum(extra.values()),
        "ops": [[op, at, n] for (op, at), n in list(extra.items())[:3]],
    }


def ops_words(f: Finding) -> str:
    return ", ".join(f"{op} at {at}" + (f" ({n} times)" if n > 1 else "") for op, at, n in f["ops"])


def _times(n: int) -> str:
    return f"{n} time{'s' * (n > 1)}"


def repeated_before_the_resume(s: Subject) -> Optional[Finding]:
    """Draws after the restore that are exactly the draws the uninterrupted run made before
    it wrote the checkpoint (an eval or a batch sampled at the top of the iteration that
    saves): the saved state already holds them, and the resumed run makes them again."""
    found = _extra_draws(s)
    if found is None or not found[1] or found[0] != found[1]:
        return None
    return Finding(s.where(), draws_found(s, found[0]))


def _repeated_words(f: Finding) -> str:
    return (
        "the resumed run repeats code the uninterrupted run ran before it wrote the "
        f"checkpoint: {stream_words(f['stream'])} was restored ({f['restore']} at "
        f"{f['restored_at']}) and then drawn from {_times(f['draws'])} ({ops_words(f)}), the same "
        "draws the uninterrupted run made before its save, so the saved state already holds "
        "them and the resumed run makes them a second time (an eval or a batch sampled at the "
        "top of the iteration that saves)"
    )


def advanced_by_draws(s: Subject) -> Optional[Finding]:
    """Draws after the restore and before the first resumed step that the uninterrupted run
    does not make after its save; the fixes the draws support, most likely first (a
    DataLoader's own generator when only an iterator's seed was drawn; the prefetched batch
    only when the first resumed step consumed other samples)."""
    found = _extra_draws(s)
    if found is None:
        return None
    return Finding(s.where(), {**draws_found(s, found[0]), "fixes": advance_fixes(s)})


def _advanced_words(f: Finding) -> str:
    n = f["draws"]
    return (
        f"{stream_words(f['stream'])} was restored ({f['restore']} at {f['restored_at']}) and "
        f"then advanced by {n} draw{'s' * (n > 1)} before the first resumed step that the "
        f"uninterrupted run does not make there: {ops_words(f)}"
    )


def earlier_state(s: Subject) -> Optional[Finding]:
    """A stream restored and then drawn from before the first resumed step (an iterator
    started again, its shuffle re-drawn), that arrives at the uninterrupted run's state at the
    first forward of an earlier step, not at the one of the split, with no restore after those
    draws: it was restored to the state of that earlier point (an epoch's start), and the
    state at the save is never restored. Like with like: the uninterrupted run's step records
    are taken at the next step's first forward, and its snapshot at the split must equal its
    record of the split."""
    if not s.restores or not draws_on(s.res, s.name, s.last_restore):
        return None
    key, steps = s.keys[0], s.ev.base.get(s.rank, {})
    value, own = point_value(s.res, key), steps.get(s.ev.split, {}).get(key)
    if value is None or own is None or point_value(s.base, key) != own:
        return None
    earlier = [
        k for k, values in sorted(steps.items()) if k < s.ev.split and values.get(key) == value
    ]
    if not earlier:
        return None
    restore = s.restores[-1]
    return Finding(
        s.where(),
        {
            **draws_found(s, draws_on(s.res, s.name, s.last_restore)),
            "after_step": earlier[-1],
            "split": s.ev.split,
            "how": how_restored(s.name),
            "stream_words": stream_words(s.name),
            "restore": restore["call"],
        },
    )


def _earlier_words(f: Finding) -> str:
    k = f["after_step"]
    return (
        f"{f['stream_words']} was restored ({f['restore']} at {f['restored_at']}) and, after the "
        f"draws that follow ({ops_words(f)}), holds the uninterrupted run's state at the first "
        f"forward of step {k + 1} (after step {k}), not the one at the save (after step "
        f"{f['split']}): it was restored to the state of that earlier point (an epoch's start, "
        "to draw its shuffle again), and the state at the save is never restored"
    )


def restored_too_late(s: Subject) -> Optional[Finding]:
    """The uninterrupted run draws from the stream in its window; the resumed run made the
    same draws before it restored the stream (a batch fetched, then the RNG restored)."""
    if not s.restores:
        return None
    expected = {op for op, _ in draws_on(s.base, s.name)}
    early = [
        d
        for d in (s.res or {}).get("draws", [])
        if d.get("stream") == s.name
        and d["op"] in expected
        and d["after_restores"] <= s.last_restore
    ]
    if not early:
        return None
    restore = s.restores[-1]
    return Finding(
        s.where(),
        {
            "stream": s.name,
            "restore": restore["call"],
            "restored_at": restore["at"],
            "op": early[0]["op"],
            "drawn_at": early[0]["at"],
        },
    )


def _too_late_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} was restored ({f['restore']} at {f['restored_at']}) only "
        f"after it had been drawn from ({f['op']} at {f['drawn_at']}), a draw the "
        "uninterrupted run makes from the restored state: what it made came from the "
        "unrestored stream"
    )


ID = "resume.stream."
DERIVED = ID + "derived-from-parent"
RESEEDED_REPLAYING = ID + "re-seeded-replaying-an-epoch"
BUILT_AFTER_LOAD = ID + "generator-built-after-load"
RESEEDED = ID + "re-seeded"
REPEATED = ID + "repeated-before-the-resume"
ADVANCED = ID + "restored-then-advanced"
EARLIER = ID + "restored-to-an-earlier-state"
RESTORE_RULES = (
    Rule(
        RESEEDED_REPLAYING,
        STAGE,
        REPLAYED_EPOCH,
        reseeded_replaying,
        _reseeded_replaying_words,
        after=(DERIVED,),
    ),
    Rule(
        BUILT_AFTER_LOAD,
        STAGE,
        NEVER_RESTORED,
        generator_built_after_load,
        _built_after_load_words,
        after=(RESEEDED_REPLAYING,),
    ),
    Rule(RESEEDED, STAGE, RESEEDED_AFTER_LOADING, reseeded, _reseeded_words, (BUILT_AFTER_LOAD,)),
    Rule(
        REPEATED,
        STAGE,
        REPEATED_BEFORE_THE_RESUME,
        repeated_before_the_resume,
        _repeated_words,
        after=(RESEEDED,),
    ),
    Rule(
        EARLIER,
        STAGE,
        RESTORED_TO_AN_EARLIER_STATE,
        earlier_state,
        _earlier_words,
        after=(REPEATED,),
    ),
    Rule(ADVANCED, STAGE, RESTORED_THEN_ADVANCED, advanced_by_draws, _advanced_words, (EARLIER,)),
    Rule(
        ID + "restored-too-late",
        STAGE,
        RESTORED_TOO_LATE,
        restored_too_late,
        _too_late_words,
        (ADVANCED,),
    ),
)
"""Re-seeding explains any draw after it; draws that repeat the uninterrupted run's before its
save, or that arrive at an earlier state, explain an advance; an advance explains a draw seen
before the restore."""
