"""The causes of one random stream that differs at the resume point (`Stage.STREAM`), read
with the restore log and the draws traced before the first resumed step."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ..rank.layout import GENERATOR, parent_stream, stream_kind
from .classes import (
    NEVER_RESTORED,
    REPEATED_BEFORE_THE_RESUME,
    REPLAYED_EPOCH,
    RESEEDED_AFTER_LOADING,
    RESTORED_FROM_ANOTHER_RANK,
    RESTORED_THEN_ADVANCED,
    RESTORED_TOO_LATE,
    RESTORED_WRONG,
    rng_before_iterator,
)
from .draws import advance_fixes, draws_on, shuffles_data, to_forward
from .replay import replayed_epoch
from .rules import Finding, Rule, Stage
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
    base_point = to_forward(s.base) if (s.res or {}).get("forward_before") else s.base
    base = draws_on(base_point, s.name)
    after_save = draws_on(base_point, s.name, since_ns=saved_at) if saved_at else base
    extra = draws_on(s.res, s.name, s.last_restore) - after_save
    if not extra:
        return None
    return extra, (base - after_save if saved_at else Counter())


def _draws_found(s: Subject, extra: Counter) -> dict:
    restore = s.restores[-1]
    return {
        "stream": s.name,
        "restore": restore["call"],
        "restored_at": restore["at"],
        "draws": sum(extra.values()),
        "ops": [[op, at, n] for (op, at), n in list(extra.items())[:3]],
    }


def _ops(f: Finding) -> str:
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
    return Finding(s.where(), _draws_found(s, found[0]))


def _repeated_words(f: Finding) -> str:
    return (
        "the resumed run repeats code the uninterrupted run ran before it wrote the "
        f"checkpoint: {stream_words(f['stream'])} was restored ({f['restore']} at "
        f"{f['restored_at']}) and then drawn from {_times(f['draws'])} ({_ops(f)}), the same "
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
    return Finding(s.where(), {**_draws_found(s, found[0]), "fixes": advance_fixes(s)})


def _advanced_words(f: Finding) -> str:
    n = f["draws"]
    return (
        f"{stream_words(f['stream'])} was restored ({f['restore']} at {f['restored_at']}) and "
        f"then advanced by {n} draw{'s' * (n > 1)} before the first resumed step that the "
        f"uninterrupted run does not make there: {_ops(f)}"
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
RESEEDED_REPLAYING = ID + "re-seeded-replaying-an-epoch"
BUILT_AFTER_LOAD = ID + "generator-built-after-load"
RESEEDED = ID + "re-seeded"
REPEATED = ID + "repeated-before-the-resume"
ADVANCED = ID + "restored-then-advanced"
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
    Rule(ADVANCED, STAGE, RESTORED_THEN_ADVANCED, advanced_by_draws, _advanced_words, (REPEATED,)),
    Rule(
        ID + "restored-too-late",
        STAGE,
        RESTORED_TOO_LATE,
        restored_too_late,
        _too_late_words,
        (ADVANCED,),
    ),
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
        ID + "restored-wrong",
        STAGE,
        RESTORED_WRONG,
        restored_wrong,
        _restored_wrong_words,
        always=True,
    ),
)
"""The causes of a stream that differs at the resume point; `restored-wrong` is the last word."""
