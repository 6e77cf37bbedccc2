"""The first divergent step's causes in its random streams and its learning rate (`Stage.STEP`):
they change everything computed after them, so they are asked before the state they move."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import (
    DEVICE_KINDS,
    generator_site,
    parent_stream,
    split_key,
    stream_kind,
    watched_part,
)
from ..signature import scalar
from .classes import (
    DEVICE_RNG,
    LR_SCHEDULER_MISSING,
    LR_SCHEDULER_OFF_BY_ONE,
    OWNED_GENERATOR,
    PER_RANK_RNG_COLLAPSED,
    STREAM_KINDS,
    rng_before_iterator,
    rng_stream,
)
from .evidence import (
    Evidence,
    borrowed_from,
    lr_shift,
    scheduler_restarted,
)
from .rules import Finding, Rule, Stage
from .stream_words import HOW, STREAM_WORDS, stream_words

STEP = (Stage.STEP,)
CORE_STREAMS = ("cpu", *DEVICE_KINDS)
"""torch's own streams: the CPU's and each device's default generator."""
LR_PARTS = ("lr", "last_lr", "last_epoch")
"""Watched parts that follow the learning-rate schedule."""


def _generators(ev: Evidence) -> Optional[tuple[int, list[str], list[str]]]:
    """A rank where generators differ while the CPU and device streams match: the
    generators, and those re-derived from another stream."""
    for rank, keys in ev.differing.items():
        gens = [k for k in keys if generator_site(k) is not None]
        if gens and not any(stream_kind(k) in CORE_STREAMS for k in keys):
            return rank, gens, [k for k in gens if parent_stream(k) is not None]
    return None


def seeded_from_parent(ev: Evidence) -> Optional[Finding]:
    """Every generator that differs is re-derived from a stream that matches at this step (a
    sampler's, seeded from the CPU RNG when an iterator starts): the parent differed when the
    iterator started."""
    found = _generators(ev)
    if found is None or len(found[2]) != len(found[1]):
        return None
    rank, _, derived = found
    parent = parent_stream(derived[0]) or ""
    return Finding(
        ev.where(rank),
        {
            "stream": derived[0],
            "parent": stream_words(parent),
            "how": HOW.get(stream_kind(parent), ""),
        },
    )


def _seeded_words(f: Finding) -> str:
    return (
        f"{stream_words(f['stream'])} differs while {f['parent']}, which seeds it when an "
        f"iterator starts, matches at this step: {f['parent']} was not the uninterrupted run's "
        "state when the iterator started (restored only after it)"
    )


def owned_generator(ev: Evidence) -> Optional[Finding]:
    """A generator owned by some module or sampler differs while the global streams match."""
    found = _generators(ev)
    if found is None or len(found[2]) == len(found[1]):
        return None
    rank, gens, derived = found
    return Finding(
        ev.where(rank), {"site": generator_site(next(k for k in gens if k not in derived))}
    )


def _owned_words(f: Finding) -> str:
    return (
        f"the generator created at {f['site']} differs while the CPU and device generators "
        "match: its state was not restored (a module or sampler owns a torch.Generator and "
        "re-seeds it when constructed)"
    )


def _streams_of(ev: Evidence, kinds: tuple[str, ...]):
    for kind in kinds:
        for rank, keys in ev.differing.items():
            hits = [k for k in keys if stream_kind(k) == kind]
            if hits:
                yield rank, kind, hits[0]


def collapsed(ev: Evidence) -> Optional[Finding]:
    """After the resume a rank's stream equals another rank's uninterrupted one."""
    for rank, _, key in _streams_of(ev, (*CORE_STREAMS, "numpy", "python")):
        other = borrowed_from(ev.base, ev.res, rank, ev.step, key)
        if other is not None:
            return Finding(
                ev.where(rank), {"rank": rank, "stream": split_key(key)[1], "other": other}
            )
    return None


def _collapsed_words(f: Finding) -> str:
    return (
        f"after the resume, rank {f['rank']}'s {f['stream']} RNG state equals rank "
        f"{f['other']}'s: one rank's RNG state was loaded into another (a checkpoint file that "
        "only rank 0 writes holds only rank 0's)"
    )


SAVE_RESTORE = {kind: HOW[kind].split(" / ") for kind in STREAM_KINDS}


def global_stream_of(kind: str):
    def global_stream(ev: Evidence) -> Optional[Finding]:
        """A global stream (torch's CPU generator, numpy's, Python's) differs at the step."""
        found = next(_streams_of(ev, (kind,)), None)
        if found is None:
            return None
        save, restore = SAVE_RESTORE[kind]
        return Finding(ev.where(found[0]), {"stream": kind, "save": save, "restore": restore})

    return global_stream


def _global_words(f: Finding) -> str:
    why = ", or manual_seed called again after loading" if f["stream"] == "cpu" else " and restored"
    return f"{STREAM_WORDS[f['stream']]} differs: it was not restored ({f['save']} not saved{why})"


def device_stream(ev: Evidence) -> Optional[Finding]:
    """A device's stream differs (not saved, or only the current device restored)."""
    found = next(_streams_of(ev, DEVICE_KINDS), None)
    if found is None:
        return None
    return Finding(ev.where(found[0]), {"kind": found[1], "device": split_key(found[2])[1]})


def _device_words(f: Finding) -> str:
    return (
        f"the {f['kind']} RNG of device {f['device']} differs: device RNG not restored "
        f"(torch.{f['kind']}.get_rng_state_all() not saved, or only the current device restored)"
    )


def _lr(ev: Evidence):
    for rank, keys in ev.differing.items():
        lr = [k for k in keys if watched_part(k) in LR_PARTS]
        if lr:
            rates = [k for k in lr if watched_part(k) in ("lr", "last_lr")]
            evidence = {
                "rate": split_key(lr[0])[1],
                "warmup": bool(rates) and _warms_up(ev, rank, rates[0]),
                "restarted": scheduler_restarted(ev.base, ev.res, rank, ev.step, ev.split),
                "shift": lr_shift(ev.base, ev.res, rank, ev.step, lr[0]),
            }
            return Finding(ev.where(rank), evidence)
    return None


def schedule_restarted(ev: Evidence) -> Optional[Finding]:
    """The learning rate differs and the scheduler counts its steps from the resume."""
    found = _lr(ev)
    return found if found is not None and found["restarted"] is True else None


def _restarted_words(f: Finding) -> str:
    warmup = " (its warmup restarted)" if f["warmup"] else ""
    return (
        f"the learning rate differs ({f['rate']}) and the scheduler counts its steps from the "
        f"resume, not from the start: the LR scheduler was not restored{warmup}"
    )


def schedule_shifted(ev: Evidence) -> Optional[Finding]:
    """The learning rate equals the uninterrupted run's one step before or after, or the
    scheduler's count is off by one."""
    found = _lr(ev)
    if found is None or found["restarted"] is True:
        return None
    return found if found["restarted"] is False or found["shift"] is not None else None


def _shifted_words(f: Finding) -> str:
    return (
        f"the learning rate is shifted by one step ({f['rate']}): the scheduler was saved "
        "before its step, or rebuilt/stepped after the optimizer state was loaded"
    )


def rate_differs(ev: Evidence) -> Optional[Finding]:
    """The learning rate differs before any other watched state explains it."""
    return _lr(ev)


def _rate_words(f: Finding) -> str:
    warmup = " (its warmup restarted)" if f["warmup"] else ""
    return (
        f"the learning rate differs ({f['rate']}) before any other watched state explains it: "
        f"the LR scheduler was not restored{warmup}"
    )


def _warms_up(ev: Evidence, rank: int, key: str) -> bool:
    """Whether the uninterrupted run's learning rate (`key`) rises over its first steps: only
    then can a restarted schedule be called a restarted warmup."""
    values = [scalar_of(ev.base[rank].get(s, {}).get(key)) for s in sorted(ev.base[rank])[:3]]
    numbers = [v for v in values if v is not None]
    return len(numbers) >= 2 and all(a < b for a, b in zip(numbers, numbers[1:]))


def scalar_of(value: object) -> Optional[float]:
    """The first number of a recorded learning rate (a list per parameter group, or one)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return scalar(value)


ID = "step."
SEEDED, OWNED, COLLAPSED = (
    ID + "generator-seeded-from-parent",
    ID + "owned-generator",
    ID + "rng-collapsed",
)
GLOBAL = {kind: f"{ID}{kind}-rng" for kind in STREAM_KINDS}
DEVICE = ID + "device-rng"
STREAM_RULES = (
    Rule(
        SEEDED,
        STEP,
        rng_before_iterator("cpu"),
        seeded_from_parent,
        _seeded_words,
        (ID + "micro-batches",),
    ),
    Rule(OWNED, STEP, OWNED_GENERATOR, owned_generator, _owned_words, (SEEDED,)),
    Rule(COLLAPSED, STEP, PER_RANK_RNG_COLLAPSED, collapsed, _collapsed_words, (OWNED,)),
    Rule(
        GLOBAL["cpu"], STEP, rng_stream("cpu"), global_stream_of("cpu"), _global_words, (COLLAPSED,)
    ),
    Rule(DEVICE, STEP, DEVICE_RNG, device_stream, _device_words, (GLOBAL["cpu"],)),
    Rule(
        GLOBAL["numpy"],
        STEP,
        rng_stream("numpy"),
        global_stream_of("numpy"),
        _global_words,
        (DEVICE,),
    ),
    Rule(
        GLOBAL["python"],
        STEP,
        rng_stream("python"),
        global_stream_of("python"),
        _global_words,
        (GLOBAL["numpy"],),
    ),
)
"""Streams: an owned generator before the global streams, a collapse before a stream not
restored (rank 0's state everywhere is restored, just from the wrong rank)."""
RESTARTED, SHIFTED = ID + "lr-schedule-restarted", ID + "lr-off-by-one"
LR_RULES = (
    Rule(
        RESTARTED,
        STEP,
        LR_SCHEDULER_MISSING,
        schedule_restarted,
        _restarted_words,
        (ID + "accumulation-window",),
    ),
    Rule(SHIFTED, STEP, LR_SCHEDULER_OFF_BY_ONE, schedule_shifted, _shifted_words, (RESTARTED,)),
    Rule(ID + "lr-differs", STEP, LR_SCHEDULER_MISSING, rate_differs, _rate_words, (SHIFTED,)),
)
