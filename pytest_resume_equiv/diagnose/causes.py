"""The causes one subject that differs at the resume point can have, each a rule that
answers only on evidence separating it from its look-alikes, with its fix in one line."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

from ..compare.accounting import BATCH_KEY, CONTENT_KEY, ids_of, is_identity_key
from ..rank.layout import (
    GENERATOR,
    OWNED_BY,
    device_index,
    generator_site,
    parent_stream,
    split_key,
    stream_kind,
    watch_key,
    watched_part,
)
from ..rank.trace import FORWARD
from ..signature import readable
from .classes import (
    BUFFERS,
    DATA_LOADER_STATE,
    LR_SCHEDULER_OFF_BY_ONE,
    NEVER_RESTORED,
    OPTIMIZER_STATE_MISSING,
    REPEATED_BEFORE_THE_RESUME,
    REPLAYED_EPOCH,
    RESEEDED_AFTER_LOADING,
    RESTORED_AT_REDUCED_PRECISION,
    RESTORED_FROM_ANOTHER_RANK,
    RESTORED_FROM_ANOTHER_STEP,
    RESTORED_THEN_ADVANCED,
    RESTORED_TOO_LATE,
    RESTORED_WRONG,
    TORN_CHECKPOINT,
    WATCHED_STATE,
    kind_never_restored,
    rng_before_iterator,
)
from .evidence import ROUNDING, Diagnosis, first_diff_name, norm_gap
from .replay import replayed_epoch
from .subject import Subject, equal_to_step, point_value

STREAM_WORDS = {
    "cpu": "the CPU RNG (torch's default generator)",
    "numpy": "numpy's global RNG",
    "python": "Python's random module",
}
"""By stream kind: the streams of one kind each."""
HOW = {
    "cpu": "torch.get_rng_state() / torch.set_rng_state()",
    "numpy": "np.random.get_state() / np.random.set_state()",
    "python": "random.getstate() / random.setstate()",
}
"""How the one stream of each of these kinds is saved and restored."""
GENERATOR_HOW = "generator.get_state() / generator.set_state()"
KINDS = {"module": "the module", "optimizer": "the optimizer", "scheduler": "the LR scheduler"}
WRAPPED_KINDS = ("module", "optimizer", "scheduler")
"""Objects whose every load_state_dict call the restore log sees."""


def from_other_rank(s: Subject) -> Optional[Diagnosis]:
    for key in s.keys:
        value = point_value(s.res, key)
        for other in sorted(s.ev.base_sigs, key=lambda r: (r != 0, r)):
            saved = s.ev.base_sigs[other].resume_point(s.ev.split)
            if other != s.rank and saved is not None and point_value(saved, key) == value:
                return Diagnosis(
                    f"{s.where()}: at the resume point {key} equals rank {other}'s saved state: "
                    f"rank {s.rank} was restored from rank {other}'s. Fix: save each rank's own "
                    "state, keyed by its global rank (a file only rank 0 writes holds only rank "
                    "0's)",
                    RESTORED_FROM_ANOTHER_RANK,
                )
    return None


def derived_from_parent(s: Subject) -> Optional[Diagnosis]:
    """A stream re-derived from another audited stream (the generator a DataLoader's sampler
    seeds from the CPU RNG whenever an iterator starts) differs only because its parent
    differed when it was seeded: the parent is the cause, even where the parent itself matches
    at the resume point (restored after the iterator started)."""
    parent = parent_stream(s.name)
    if parent is None:
        return None
    parent_words = stream_words(parent)
    first = next((d for d in (s.res or {}).get("draws", []) if d.get("stream") == s.name), None)
    started = f" (its iterator started at {first['at']})" if first else ""
    now = (
        "and it still differs at the resume point"
        if point_value(s.base, parent) != point_value(s.res, parent)
        else "although it matches at the resume point (restored after the iterator started)"
    )
    replay = replayed_epoch(s.ev, s.rank)
    return Diagnosis(
        (f"{s.where()}: {replay}. " if replay else f"{s.where()}: ")
        + f"{stream_words(s.name)} differs at the resume point; it is seeded from "
        f"{parent_words} when an iterator starts{started}, so {parent_words} was not the "
        f"uninterrupted run's state there, {now}. Fix: before starting the iterator again, "
        f"restore {parent_words} to the state saved before the epoch's iterator started "
        f"({HOW.get(stream_kind(parent), 'set_rng_state')}), or give the DataLoader a generator "
        "of its own (DataLoader(generator=g)) and save and restore g's state",
        rng_before_iterator(stream_kind(parent)),
    )


def reseeded(s: Subject) -> Optional[Diagnosis]:
    if not s.reseeds:
        return None
    call = s.reseeds[-1]
    replay = replayed_epoch(s.ev, s.rank) if shuffles_data(s) else ""
    if replay and stream_kind(s.name) == GENERATOR:
        return Diagnosis(
            f"{s.where()}: {replay}: {stream_words(s.name)} shuffles the data and was seeded "
            f"again after the checkpoint was read ({call['call']} at {call['at']}), so the "
            "resumed epoch draws the permutation of the first one. Fix: save the generator's "
            "state from before the epoch's permutation was drawn and set_state() it before the "
            "iterator starts (after any seeding), or derive the shuffle from (seed, epoch)",
            REPLAYED_EPOCH,
        )
    if stream_kind(s.name) == GENERATOR and not s.before_resume and len(s.restores) == 1:
        return Diagnosis(
            f"{s.where()}: {stream_words(s.name)} was made and seeded after the checkpoint was "
            f"read ({call['call']} at {call['at']}) and never given its saved state: whatever "
            "owns it seeds it when it is built. Fix: save its state and load it after building "
            f"it, {GENERATOR_HOW}",
            NEVER_RESTORED,
        )
    return Diagnosis(
        f"{s.where()}: {stream_words(s.name)} was seeded again after the checkpoint was read ({call['call']} at "
        f"{call['at']}), which replaces the restored state. Fix: seed before loading, or restore "
        f"the stream after seeding ({_how(s.name)})",
        RESEEDED_AFTER_LOADING,
    )


def advanced_by_draws(s: Subject) -> Optional[Diagnosis]:
    """Draws after the restore and before the first resumed step that the uninterrupted run
    does not make after its save: either code it never runs there, or code it ran before it
    wrote the checkpoint (an eval at the top of the iteration that saves), which the resumed
    run repeats on a state that already holds that code's draws."""
    if not s.restores:
        return None
    saved_at = s.ev.saved_at(s.rank)
    base_point = _to_forward(s.base) if (s.res or {}).get("forward_before") else s.base
    base = _draws_on(base_point, s.name)
    after_save = _draws_on(base_point, s.name, since_ns=saved_at) if saved_at else base
    extra = _draws_on(s.res, s.name, s.last_restore) - after_save
    if not extra:
        return None
    total = sum(extra.values())
    ops = ", ".join(
        f"{op} at {at}" + (f" ({n} times)" if n > 1 else "")
        for (op, at), n in list(extra.items())[:3]
    )
    restore = s.restores[-1]
    before_save = base - after_save
    if saved_at and extra == before_save:
        return Diagnosis(
            f"{s.where()}: the resumed run repeats code the uninterrupted run ran before it "
            f"wrote the checkpoint: {stream_words(s.name)} was restored ({restore['call']} at "
            f"{restore['at']}) and then drawn from {total} time{'s' * (total > 1)} ({ops}), the "
            "same draws the uninterrupted run made before its save, so the saved state already "
            "holds them and the resumed run makes them a second time (an eval or a batch "
            "sampled at the top of the iteration that saves). Fix: do not run that code again "
            "at the resume iteration (or save the checkpoint before it runs), or give that code "
            "a generator of its own",
            REPEATED_BEFORE_THE_RESUME,
        )
    extra_draws = [
        d
        for d in (s.res or {}).get("draws", [])
        if d.get("stream") == s.name and d.get("after_restores", 0) > s.last_restore
    ]
    seeds = [d for d in extra_draws if d.get("op") == "random_" and d.get("shape") == []]
    fixes = ["restore the stream after that code runs"]
    own = "give that code a generator of its own"
    if seeds:  # a seed drawn from the stream: a DataLoader iterator starting there
        own = (
            f"give the DataLoader started at {seeds[0]['at']} a generator of its own "
            "(DataLoader(generator=g), seeded from (seed, epoch) at each epoch's start, or "
            "its state from the epoch's start saved and restored: its state at the save does "
            "not give the epoch's order back)"
        )
    # only seeds drawn (an iterator started, nothing else): its own generator is the fix
    fixes.insert(0 if seeds and len(seeds) == len(extra_draws) else 1, own)
    other_batch = _first_batch_differs(s)
    if other_batch is True:
        # who drew decides the order: an iterator starting (its seed draws alone) explains
        # other samples by itself, a prefetched batch comes after its fix
        loader_only = bool(seeds) and len(seeds) == len(extra_draws)
        fixes.insert(
            1 if loader_only else 0,
            "if that code fetches the first batch, the batch prefetched before the save is "
            "not in the checkpoint (the first resumed step consumed other samples): save it "
            "with the checkpoint, or fetch each batch at the top of its own step",
        )
    elif other_batch is None:
        fixes.append(
            "if that code fetches the first batch, save the batch prefetched before the save "
            "with the checkpoint"
        )
    return Diagnosis(
        f"{s.where()}: {stream_words(s.name)} was restored ({restore['call']} at "
        f"{restore['at']}) and then advanced by {total} draw{'s' * (total > 1)} before the first "
        f"resumed step that the uninterrupted run does not make there: {ops}. Fix: "
        + "; otherwise ".join(fixes),
        RESTORED_THEN_ADVANCED,
    )


def _first_batch_differs(s: Subject) -> Optional[bool]:
    """Whether the first resumed step consumed other samples than the uninterrupted run's
    (only then can a batch prefetched before the save have been lost); None when no sample ids
    were recorded, or when only content fingerprints were (the loader's batches `auto:batch`,
    else the model's inputs `auto:data`) and none of the first batch's is anywhere in the
    uninterrupted run: content drawn from the very stream that differs (an augmentation)
    changes every sample, so other samples and the same ones made otherwise cannot be told
    apart."""
    first = s.ev.split + 1
    ours = s.ev.res.get(s.rank, {}).get(first, {})
    theirs = s.ev.base.get(s.rank, {}).get(first, {})
    keys = [k for k in ours if is_identity_key(k)]
    if not keys:
        return None
    # the trainer's own ids say which samples; content fingerprints also change when the
    # same samples are augmented from the advanced stream
    own = [k for k in keys if k not in (CONTENT_KEY, BATCH_KEY)]
    if own:
        return any(ours[k] != theirs.get(k) for k in own)
    key = BATCH_KEY if BATCH_KEY in keys else CONTENT_KEY
    if ours[key] == theirs.get(key):
        return False
    seen = {
        i for values in s.ev.base.get(s.rank, {}).values() for i in ids_of(values.get(key)) or []
    }
    return True if seen & set(ids_of(ours[key]) or []) else None


def _to_forward(point: Optional[dict]) -> Optional[dict]:
    """The uninterrupted run's window up to its first forward: what a resumed run whose
    trace ended at its first forward (before its `resume_point()` call) is compared with."""
    if point is None:
        return None
    draws = point.get("draws", [])
    cut = next((i for i, d in enumerate(draws) if d.get("op") == FORWARD), len(draws))
    return {**point, "draws": draws[:cut]}


def _draws_on(
    point: Optional[dict], stream: str, after: int = -1, since_ns: Optional[int] = None
) -> Counter:
    """(op, line) -> how many draws on `stream` the window holds after log entry `after`
    (and after `since_ns`, when given)."""
    draws = (point or {}).get("draws", [])
    return Counter(
        (d["op"], d["at"])
        for d in draws
        if d.get("stream") == stream
        and d.get("after_restores", 0) > after
        and (since_ns is None or d.get("time_ns", 0) > since_ns)
    )


def restored_too_late(s: Subject) -> Optional[Diagnosis]:
    """The uninterrupted run draws from the stream in its window; the resumed run made the
    same draws before it restored the stream (a batch fetched, then the RNG restored)."""
    if not s.restores:
        return None
    expected = {op for op, _ in _draws_on(s.base, s.name)}
    early = [
        d
        for d in (s.res or {}).get("draws", [])
        if d.get("stream") == s.name
        and d["op"] in expected
        and d["after_restores"] <= s.last_restore
    ]
    if not early:
        return None
    d, restore = early[0], s.restores[-1]
    return Diagnosis(
        f"{s.where()}: {stream_words(s.name)} was restored ({restore['call']} at "
        f"{restore['at']}) only after it had been drawn from ({d['op']} at {d['at']}), a draw "
        "the uninterrupted run makes from the restored state: what it made came from the "
        "unrestored stream. Fix: restore the stream before that code runs",
        RESTORED_TOO_LATE,
    )


SHUFFLE_OPS = ("randperm",)
"""Draws that make a permutation: what a shuffle of the data draws."""


def shuffles_data(s: Subject) -> bool:
    """Evidence that the stream shuffles the data, before a replayed epoch is blamed on it:
    torch made it for a sampler, or it drew a permutation before the first forward. A
    generator that draws timesteps or noise replays its draws too when it is not restored,
    and ids recorded from them look like a replayed epoch; that is not a shuffle."""
    site = generator_site(s.name)
    if site is not None and OWNED_BY in site:
        return True
    return any(
        d.get("op") in SHUFFLE_OPS and d.get("stream") == s.name
        for point in (s.base, s.res)
        for d in (point or {}).get("draws", [])
    )


def stream_never_restored(s: Subject) -> Optional[Diagnosis]:
    if s.restores:
        return None
    kind = stream_kind(s.name)
    if kind == GENERATOR:
        how, calls = GENERATOR_HOW, "set_state"
    else:
        how = HOW.get(kind, f"torch.{kind}.get_rng_state_all() / set_rng_state_all()")
        calls = "set_rng_state" if kind not in ("numpy", "python") else how.split(" / ")[1]
    replay = replayed_epoch(s.ev, s.rank) if kind == GENERATOR and shuffles_data(s) else ""
    if replay:
        return Diagnosis(
            f"{s.where()}: {replay}: {stream_words(s.name)} shuffles the data and was never "
            f"restored (no {calls} call for it after the checkpoint was read), so the resumed "
            "epoch draws the permutation of the first one. Fix: save the generator's state "
            "from before the epoch's permutation was drawn and set_state() it before the "
            "iterator starts, or derive the shuffle from (seed, epoch)",
            REPLAYED_EPOCH,
        )
    return Diagnosis(
        f"{s.where()}: {stream_words(s.name)} was never restored (no {calls} call for it after "
        f"the checkpoint was read) and differs at the resume point. Fix: save and restore it, "
        f"{how}",
        NEVER_RESTORED,
    )


def _how(name: str) -> str:
    """How a stream's state is saved and restored."""
    kind = stream_kind(name)
    if kind == GENERATOR:
        return GENERATOR_HOW
    return HOW.get(kind, f"torch.{kind}.get_rng_state_all() / set_rng_state_all()")


def stream_words(name: str) -> str:
    site = generator_site(name)
    if site is not None and OWNED_BY in site:
        owner = site.rsplit(" #", 1)[0]
        return f"the generator the {owner} makes whenever an iterator starts"
    if site is not None:
        return f"the generator created at {site}"
    kind = stream_kind(name)
    return STREAM_WORDS.get(kind) or f"the {kind} RNG of device {device_index(name)}"


def stream_restored_wrong(s: Subject) -> Diagnosis:
    restore = s.restores[-1]
    return Diagnosis(
        f"{s.where()}: {stream_words(s.name)} was restored ({restore['call']} at {restore['at']}) but differs "
        "from the uninterrupted run's at the resume point, with no extra draw in between: the "
        "saved state is not the one at the split. Fix: save the stream's state after the step "
        "that ends at the split, next to the weights",
        RESTORED_WRONG,
    )


def object_never_restored(s: Subject) -> Optional[Diagnosis]:
    # DCP's load writes tensors in place, unlogged: weights and optimizer moments, never a
    # scheduler's counters (a Stateful scheduler in the load is a logged load_state_dict)
    if s.restores or s.kind not in WRAPPED_KINDS or (s.in_place and s.kind != "scheduler"):
        return None
    words = {
        "optimizer": "its moments, step counts and learning rates start over",
        "scheduler": "the learning-rate schedule starts over (warmup restarts)",
        "module": "its weights and buffers are the initial ones",
    }[s.kind]
    return Diagnosis(
        f"{s.where()}: {KINDS[s.kind]} '{s.label}' was never restored (no load_state_dict "
        f"call restored it): {words}. Fix: save and load its state_dict()",
        kind_never_restored(s.kind),
    )


LOADER_PARTS = {
    "epoch": (
        "its epoch",
        "restore the sampler's epoch (set_epoch(saved_epoch) on the loader made after the "
        "load, before iterating)",
    ),
    "position": (
        "its position in the epoch",
        "restore the position (StatefulDataLoader.load_state_dict), or skip exactly the "
        "batches the saved step consumed, in global samples",
    ),
    "generator": (
        "its shuffling generator",
        "save the sampler's / loader's generator state and set it before the iterator is made",
    ),
    "workers": (
        "its per-worker state",
        "load the loader state before its workers start (persistent workers keep what they had)",
    ),
    "dataset": ("its dataset's state", "save and load the dataset's state_dict()"),
}


def loader_parts(s: Subject) -> Optional[Diagnosis]:
    """A data loader: which of its parts differ at the resume point, each with its fix."""
    if s.kind != "loader":
        return None
    parts = [watched_part(k) for k in s.keys]
    parts = [p for p in LOADER_PARTS if p in parts]
    shown = []
    for part in parts:
        key = watch_key(s.label, part)
        a, b = point_value(s.base, key), point_value(s.res, key)
        name = first_diff_name(a, b)
        if isinstance(a, dict) and isinstance(b, dict) and name in a and name in b:
            a, b = a[name], b[name]
        label = f"{name}: " if name else ""
        shown.append(
            f"{LOADER_PARTS[part][0]} ({label}uninterrupted {readable(a)}, resumed {readable(b)})"
        )
    fixes = "; ".join(LOADER_PARTS[p][1] for p in parts)
    return Diagnosis(
        f"{s.where()}: the data loader '{s.label}' was not restored as saved: "
        + ", ".join(shown)
        + f" differ{'s' * (len(parts) == 1)} at the resume point. Fix: {fixes}",
        DATA_LOADER_STATE,
    )


def optimizer_partial(s: Subject) -> Optional[Diagnosis]:
    key = watch_key(s.label, "state")
    if s.kind != "optimizer" or key not in s.keys:
        return None
    a, b = point_value(s.base, key) or {}, point_value(s.res, key) or {}
    empty = sorted(n for n in a if a.get(n) and not b.get(n))
    steps = sorted(
        n for n in set(a) & set(b) if (a[n] or {}).get("step") != (b[n] or {}).get("step")
    )
    if not empty and not steps:
        return None
    what = f"no entries for {', '.join(empty[:3])}" if empty else f"step counts differ ({steps[0]})"
    return Diagnosis(
        f"{s.where()}: the optimizer state of '{s.label}' is missing or partial at the resume "
        f"point ({what}). Fix: save and load optimizer.state_dict(), after the optimizer step",
        OPTIMIZER_STATE_MISSING,
    )


def reduced_precision(s: Subject) -> Optional[Diagnosis]:
    for key in (k for k in s.keys if watched_part(k) == "params"):
        gap = norm_gap(point_value(s.base, key), point_value(s.res, key))
        if gap is not None and 0 < gap < ROUNDING:
            what = (
                f"the optimizer's own copies of the parameters ('{s.label}': master weights)"
                if s.kind == "optimizer"
                else f"the parameters of '{s.label}'"
            )
            return Diagnosis(
                f"{s.where()}: at the resume point {what} differ only at low-precision rounding "
                f"level (relative {gap:.1e}): restored at reduced precision. Fix: save the fp32 "
                "master weights instead of rebuilding them from the bf16/fp16 weights",
                RESTORED_AT_REDUCED_PRECISION,
            )
    return None


def scheduler_shifted(s: Subject) -> Optional[Diagnosis]:
    key = watch_key(s.label, "last_epoch")
    a, b = point_value(s.base, key), point_value(s.res, key)
    if s.kind != "scheduler" or not isinstance(a, int) or not isinstance(b, int) or abs(a - b) != 1:
        return None
    return Diagnosis(
        f"{s.where()}: the LR scheduler '{s.label}' is {'one step ahead' if b > a else 'one step behind'} "
        "at the resume point: it was stepped again after loading, or saved before its step. "
        "Fix: save the scheduler after its step; do not step it after load_state_dict",
        LR_SCHEDULER_OFF_BY_ONE,
    )


def buffers_only(s: Subject) -> Optional[Diagnosis]:
    if s.kind != "module" or [watched_part(k) for k in s.keys] != ["buffers"]:
        return None
    key = s.keys[0]
    name = first_diff_name(point_value(s.base, key), point_value(s.res, key))
    return Diagnosis(
        f"{s.where()}: the weights of '{s.label}' were restored but buffer {name} differs at "
        "the resume point: buffers (BatchNorm running statistics) were left out of the saved or "
        "loaded state (strict=False?), or saved from rank 0 only. Fix: save and load the whole "
        "state_dict(), buffers included",
        BUFFERS,
    )


def from_other_step(s: Subject) -> Optional[Diagnosis]:
    part = {"module": "params", "optimizer": "state"}.get(s.kind)
    later = equal_to_step(s.ev, s.rank, s.label, part) if part else None
    if later is None:
        return None
    if later > s.ev.split:
        what = "its state (moments, step counts)" if part == "state" else "its parameters"
        return Diagnosis(
            f"{s.where()}: the checkpoint saved at step {s.ev.split} holds '{s.label}' "
            f"({what}) as it was after step {later}: its contents are from a later step than "
            "it claims, a staging race (the save read the live tensors after training had "
            "changed them: a background or asynchronous save that did not copy them when it "
            "staged). Fix: copy the state when the save starts (dcp.async_save stages a copy; a "
            "background torch.save needs a deep copy) or wait for the write before the next "
            "step changes it",
            TORN_CHECKPOINT,
        )
    return Diagnosis(
        f"{s.where()}: '{s.label}' at the resume point is the uninterrupted run's state after "
        f"step {later}, not step {s.ev.split}: an older checkpoint was loaded. Fix: load the "
        "checkpoint saved at the split",
        RESTORED_FROM_ANOTHER_STEP,
    )


def object_restored_wrong(s: Subject) -> Diagnosis:
    key = s.keys[0]
    name = first_diff_name(point_value(s.base, key), point_value(s.res, key))
    how = f" (restored by {s.restores[-1]['call']} at {s.restores[-1]['at']})" if s.restores else ""
    return Diagnosis(
        f"{s.where()}: '{s.label}'{how} differs from the uninterrupted run's at the resume "
        f"point ({split_key(key)[1]}{f' {name}' if name else ''}): its state was not restored as saved. "
        "Fix: save its state_dict() after the step that ends at the split and load it back "
        "into this object",
        WATCHED_STATE,
    )


StreamRule = Callable[[Subject], Optional[Diagnosis]]
STREAM_RULES: tuple[StreamRule, ...] = (
    from_other_rank,
    derived_from_parent,
    reseeded,
    advanced_by_draws,
    restored_too_late,
    stream_never_restored,
    stream_restored_wrong,
)
OBJECT_RULES: tuple[StreamRule, ...] = (
    from_other_rank,
    loader_parts,
    object_never_restored,
    from_other_step,  # equal to another step's whole state: before what a part of it says
    optimizer_partial,
    reduced_precision,
    scheduler_shifted,
    buffers_only,
    object_restored_wrong,
)
"""For one subject, in the order that separates look-alikes (the last always answers)."""
