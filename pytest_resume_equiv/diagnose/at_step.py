"""Causes read from the first divergent step itself: the fallback when the resume point does
not explain the divergence (no snapshot, or nothing differs there).

Checked in the order in which one cause can explain another: a random stream or the learning
rate changes everything computed after it, so those come before parameters and values.
"""

from __future__ import annotations

from typing import Optional

from ..rank.layout import (
    AUTO,
    DEVICE_KINDS,
    RNG,
    WATCH,
    audit_key,
    generator_site,
    is_audit_key,
    parent_stream,
    section_of,
    split_key,
    stream_kind,
    watched,
    watched_part,
)
from ..signature import scalar
from .at_step_data import consumed_data, unseen_input
from .causes import stream_words
from .classes import (
    BUFFERS,
    COMPUTED_DIFFERENTLY,
    DEVICE_RNG,
    GRADIENT_ACCUMULATION,
    LR_SCHEDULER_MISSING,
    LR_SCHEDULER_OFF_BY_ONE,
    MASTER_WEIGHTS,
    OPTIMIZER_STATE,
    OWNED_GENERATOR,
    PER_RANK_RNG_COLLAPSED,
    TORN_CHECKPOINT,
    TRAIN_EVAL_FLAGS,
    UNAUDITED_STATE,
    WATCHED_STATE,
    rng_before_iterator,
    rng_stream,
)
from .evidence import (
    ROUNDING,
    Diagnosis,
    Evidence,
    borrowed_from,
    first_diff_name,
    is_optimizer,
    lr_shift,
    norm_gap,
    optimizer_steps_differ,
    scheduler_restarted,
)
from .subject import held_at_resume, point_value

CORE_STREAMS = ("cpu", *DEVICE_KINDS)
"""torch's own streams: the CPU's and each device's default generator."""
LR_PARTS = ("lr", "last_lr", "last_epoch")
"""Watched parts that follow the learning-rate schedule."""


def _owned_generator(ev: Evidence) -> Optional[Diagnosis]:
    """A generator owned by some module or sampler, while the global streams are fine."""
    for rank, keys in ev.differing.items():
        gens = [k for k in keys if generator_site(k) is not None]
        core = [k for k in keys if stream_kind(k) in CORE_STREAMS]
        if gens and not core:
            derived = [k for k in gens if parent_stream(k) is not None]
            if len(derived) == len(gens):
                return _seeded_from_parent(ev, rank, derived[0])
            site = generator_site(next(k for k in gens if k not in derived))
            return Diagnosis(
                f"{ev.where(rank)}: the generator created at {site} differs while the CPU and device "
                "generators match: its state was not restored (a module or sampler owns a "
                "torch.Generator and re-seeds it when constructed). Fix: save its state and load "
                "it after building it, generator.get_state() / generator.set_state()",
                OWNED_GENERATOR,
            )
    return None


def _seeded_from_parent(ev: Evidence, rank: int, key: str) -> Diagnosis:
    """A sampler's generator, seeded from the CPU RNG when an iterator starts, differs while
    the CPU RNG matches at this step: the CPU RNG differed when that iterator started."""
    parent = parent_stream(key) or ""
    return Diagnosis(
        f"{ev.where(rank)}: {stream_words(key)} differs while {stream_words(parent)}, which "
        f"seeds it when an iterator starts, matches at this step: {stream_words(parent)} was "
        "not the uninterrupted run's state when the iterator started (restored only after "
        "it). Fix: restore it to the state saved before the epoch's iterator started, before "
        "starting the iterator again, or give the DataLoader a generator of its own "
        "(DataLoader(generator=g)) and save and restore g's state",
        rng_before_iterator(stream_kind(parent)),
    )


def _global_stream(ev: Evidence) -> Optional[Diagnosis]:
    """The global streams: collapsed to rank 0's, or simply not restored."""
    stream_words = {
        "cpu": (
            "the CPU RNG (torch default generator)",
            "torch.get_rng_state() not saved, or manual_seed called again after loading. Fix: "
            "save torch.get_rng_state() with the checkpoint and torch.set_rng_state() it after "
            "every seeding",
        ),
        "numpy": (
            "numpy's global RNG",
            "np.random.get_state() not saved and restored. Fix: save np.random.get_state() "
            "and np.random.set_state() it after loading",
        ),
        "python": (
            "Python's random module",
            "random.getstate() not saved and restored. Fix: save random.getstate() and "
            "random.setstate() it after loading",
        ),
    }
    for kind in (*CORE_STREAMS, "numpy", "python"):
        for rank, keys in ev.differing.items():
            hits = [k for k in keys if stream_kind(k) == kind]
            if not hits:
                continue
            key = hits[0]
            name = split_key(key)[1]
            other = borrowed_from(ev.base, ev.res, rank, ev.step, key)
            if other is not None:
                return Diagnosis(
                    f"{ev.where(rank)}: after the resume, rank {rank}'s {name} RNG state equals rank "
                    f"{other}'s: one rank's RNG state was loaded into another (a checkpoint file "
                    "that only rank 0 writes holds only rank 0's). Fix: save each rank's own "
                    "state, keyed by its global rank, not its local rank",
                    PER_RANK_RNG_COLLAPSED,
                )
            if name in stream_words:
                what, why = stream_words[name]
                return Diagnosis(
                    f"{ev.where(rank)}: {what} differs: it was not restored ({why})",
                    rng_stream(name),
                )
            return Diagnosis(
                f"{ev.where(rank)}: the {kind} RNG of device {name} differs: device RNG not restored "
                f"(torch.{kind}.get_rng_state_all() not saved, or only the current device "
                f"restored). Fix: save torch.{kind}.get_rng_state_all() and restore every "
                f"device's with torch.{kind}.set_rng_state_all()",
                DEVICE_RNG,
            )
    return None


LOSS_KEY = audit_key(AUTO, "loss")
"""One value per `backward()` of the step (automatic recording): its micro-batches."""


def _micro_batches(ev: Evidence) -> Optional[Diagnosis]:
    """Automatic recording: the optimizer step took another number of micro-batches (one
    `backward()` each) in the resumed run: the accumulation restarted out of phase."""
    for rank in ev.differing:
        base = ev.base[rank][ev.step].get(LOSS_KEY)
        res = ev.res[rank][ev.step].get(LOSS_KEY)
        if isinstance(base, list) and isinstance(res, list) and len(base) != len(res):
            return Diagnosis(
                f"{ev.where(rank)}: the optimizer step took {_micro(len(res))} (backward "
                f"calls) in the resumed run and {len(base)} in the uninterrupted run: the "
                "gradient-accumulation micro-step counter was not restored as saved (restored "
                "in optimizer steps, or reset), so the resumed run accumulates out of phase. "
                "Fix: save the micro-step counter, in micro-batches, with the checkpoint and "
                "restore it (or checkpoint only at an optimizer step and start the count at 0)",
                GRADIENT_ACCUMULATION,
            )
    return None


def _micro(n: int) -> str:
    return f"{n} micro-batch" if n == 1 else f"{n} micro-batches"


def _accumulation(ev: Evidence) -> Optional[Diagnosis]:
    """The optimizer stepped a different number of times (and the scheduler with it)."""
    for rank, keys in ev.differing.items():
        lr = [k for k in keys if watched_part(k) in LR_PARTS]
        if lr and optimizer_steps_differ(ev.base, ev.res, rank, ev.step, keys):
            return Diagnosis(
                f"{ev.where(rank)}: the optimizer and the LR scheduler stepped a different number of "
                "times (the optimizer's step count differs): the gradient-accumulation micro-step "
                "counter or the partially accumulated gradients were not restored. Fix: save "
                "the micro-step counter (and the accumulated gradients, or checkpoint only at "
                "an optimizer step) and restore them",
                GRADIENT_ACCUMULATION,
            )
    return None


def _learning_rate(ev: Evidence) -> Optional[Diagnosis]:
    """Learning rate and scheduler."""
    for rank, keys in ev.differing.items():
        lr = [k for k in keys if watched_part(k) in LR_PARTS]
        if not lr:
            continue
        which = split_key(lr[0])[1]
        restarted = scheduler_restarted(ev.base, ev.res, rank, ev.step, ev.split)
        rates = [k for k in lr if watched_part(k) in ("lr", "last_lr")]
        warmup = " (its warmup restarted)" if rates and _warms_up(ev, rank, rates[0]) else ""
        if restarted is True:
            return Diagnosis(
                f"{ev.where(rank)}: the learning rate differs ({which}) and the scheduler counts "
                "its steps from the resume, not from the start: the LR scheduler was not "
                f"restored{warmup}. Fix: save scheduler.state_dict() with the checkpoint and "
                "load it after building the scheduler",
                LR_SCHEDULER_MISSING,
            )
        shift = lr_shift(ev.base, ev.res, rank, ev.step, lr[0])
        if restarted is False or shift is not None:
            return Diagnosis(
                f"{ev.where(rank)}: the learning rate is shifted by one step ({which}): the "
                "scheduler was saved before its step, or rebuilt/stepped after the optimizer "
                "state was loaded. Fix: save the scheduler after its step, and do not step it "
                "after load_state_dict",
                LR_SCHEDULER_OFF_BY_ONE,
            )
        return Diagnosis(
            f"{ev.where(rank)}: the learning rate differs ({which}) before any other watched "
            f"state explains it: the LR scheduler was not restored{warmup}. Fix: save "
            "scheduler.state_dict() with the checkpoint and load it after building the "
            "scheduler",
            LR_SCHEDULER_MISSING,
        )
    return None


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


def _modes(ev: Evidence) -> Optional[Diagnosis]:
    """Train/eval flags."""
    for rank, keys in ev.differing.items():
        for key in keys:
            if watched_part(key) == "modes":
                a, b = ev.base[rank][ev.step].get(key) or [], ev.res[rank][ev.step].get(key) or []
                flipped = sorted(set(a) ^ set(b))
                return Diagnosis(
                    f"{ev.where(rank)}: module train/eval flags differ ({', '.join(flipped)} in eval mode "
                    "in one run only): a submodule's mode is not the same after the resume. Fix: "
                    "call model.train() after loading (and after any eval), or save and restore "
                    "the flags the training changes",
                    TRAIN_EVAL_FLAGS,
                )
    return None


def _wrong_weights(ev: Evidence) -> Optional[Diagnosis]:
    """Wrong weights loaded: the very first resumed step already computes something else."""
    for rank, keys in ev.differing.items():
        user = [k for k in keys if not is_audit_key(k)]
        model_params = [
            k
            for k in keys
            if watched_part(k) == "params"
            and not is_optimizer(ev.base[rank][ev.step], watched(k)[0])
        ]
        if ev.step == ev.split + 1 and user and model_params:
            base_point, res_point = ev.points(rank)
            if (
                base_point
                and res_point
                and all(
                    point_value(base_point, k) == point_value(res_point, k) for k in model_params
                )
            ):
                return unseen_input(ev, rank, user)
            name = first_diff_name(
                ev.base[rank][ev.step].get(model_params[0]),
                ev.res[rank][ev.step].get(model_params[0]),
            )
            return Diagnosis(
                f"{ev.where(rank)}: the recorded values ({', '.join(user)}) and parameters ({name}) "
                "already differ at the first resumed step while every RNG stream, the learning "
                "rate and the data match: the loaded weights are not the weights at save time (an "
                "asynchronous or torn checkpoint written after the tensors changed, or the wrong "
                "checkpoint loaded). Fix: load the checkpoint saved at the split, and finish "
                "(or copy the state of) a save before the next step changes the tensors",
                TORN_CHECKPOINT,
            )
    return None


def _buffers(ev: Evidence) -> Optional[Diagnosis]:
    """Buffers (BatchNorm running statistics and the like)."""
    for rank, keys in ev.differing.items():
        for key in keys:
            if watched_part(key) == "buffers":
                name = first_diff_name(
                    ev.base[rank][ev.step].get(key), ev.res[rank][ev.step].get(key)
                )
                return Diagnosis(
                    f"{ev.where(rank)}: buffer {name} of {watched(key)[0]} differs: buffers (e.g. BatchNorm "
                    "running statistics) were not saved/restored, or saved from rank 0 only. Fix: "
                    "save and load the whole state_dict(), buffers included, from every rank "
                    "that holds its own",
                    BUFFERS,
                )
    return None


def _master_weights(ev: Evidence) -> Optional[Diagnosis]:
    """Master weights: the optimizer updates its own copies of the parameters (names it
    could not map to a watched model), and they differ only at low-precision rounding level."""
    for rank, keys in ev.differing.items():
        for key in keys:
            obj, part = watched(key)
            if part != "params" or not is_optimizer(ev.base[rank][ev.step], obj):
                continue
            a, b = ev.base[rank][ev.step].get(key) or {}, ev.res[rank][ev.step].get(key) or {}
            own = {n: v for n, v in a.items() if n.startswith("group")}
            gap = norm_gap(own, {n: b[n] for n in own if n in b})
            if own and gap is not None and gap < ROUNDING:
                return Diagnosis(
                    f"{ev.where(rank)}: the optimizer's own copies of the parameters (master weights) "
                    f"differ only at rounding level (relative {gap:.1e}): fp32 master weights were "
                    "rebuilt from the low-precision model weights instead of being saved. Fix: "
                    "save the optimizer's fp32 master weights and load them back",
                    MASTER_WEIGHTS,
                )
    return None


def _optimizer_or_watched(ev: Evidence) -> Optional[Diagnosis]:
    """Optimizer state, then other watched objects (an EMA follows the model: after)."""
    for rank, keys in ev.differing.items():
        for key in keys:
            obj, section = watched(key)
            if section in ("state", "hyper") and is_optimizer(ev.base[rank][ev.step], obj):
                name = first_diff_name(
                    ev.base[rank][ev.step].get(key), ev.res[rank][ev.step].get(key)
                )
                return Diagnosis(
                    f"{ev.where(rank)}: the optimizer state differs ({name}): moments or step "
                    "counts were not saved, or were reset after loading. Fix: save "
                    "optimizer.state_dict() after the optimizer step and load it after building "
                    "the optimizer (not before a reset or a re-creation)",
                    OPTIMIZER_STATE,
                )
    for rank, keys in ev.differing.items():
        for key in keys:
            if section_of(key) != WATCH:
                continue
            obj, section = watched(key)
            name = first_diff_name(ev.base[rank][ev.step].get(key), ev.res[rank][ev.step].get(key))
            if obj != "model" and not is_optimizer(ev.base[rank][ev.step], obj) and section != "lr":
                return Diagnosis(
                    f"{ev.where(rank)}: the watched object '{obj}' differs ({section} {name}): its "
                    "state was not saved or not restored (an EMA, loss scaler or similar). Fix: "
                    f"save '{obj}''s state_dict() with the checkpoint and load it back",
                    WATCHED_STATE,
                )
    for rank, keys in ev.differing.items():
        params = [k for k in keys if watched_part(k) == "params"]
        if params:
            name = first_diff_name(
                ev.base[rank][ev.step].get(params[0]), ev.res[rank][ev.step].get(params[0])
            )
            return Diagnosis(
                f"{ev.where(rank)}: parameters differ ({name}) although the recorded values matched: "
                "the optimizer state (moments, step count) was not restored exactly. Fix: save "
                "optimizer.state_dict() after the optimizer step and load it back; watch() the "
                "optimizer to see which entry",
                OPTIMIZER_STATE,
            )
    return None


def _unaudited(ev: Evidence) -> Diagnosis:
    """Only what the user recorded differs, and nothing audited explains it."""
    rank, keys = next(iter(ev.differing.items()))
    user = [k for k in keys if not is_audit_key(k)]
    return Diagnosis(
        f"{ev.where(rank)}: recorded values differ ({', '.join(user)}) while every audited RNG stream "
        "and watched state matches: state the audit does not see was not restored (data "
        "loader position, per-rank counters, a custom object). Fix: save and restore that state; "
        "record its inputs or watch() it, and the report names which",
        UNAUDITED_STATE,
    )


STEP_RULES = (
    _micro_batches,
    _owned_generator,
    _global_stream,
    _accumulation,
    _learning_rate,
    consumed_data,
    _modes,
    _wrong_weights,
    _buffers,
    _master_weights,
    _optimizer_or_watched,
)
"""In the order in which one cause can explain another: how many micro-batches a step took, a
random stream or the learning rate changes everything computed after it, so those come before
parameters and recorded values."""


def _computed_differently(ev: Evidence) -> Diagnosis:
    """Everything audited matched at the resume point, yet a resumed step computed something
    else: the cause is in what the audit did not see, never in how a watched object or an
    audited stream was saved or restored (that would contradict the resume point)."""
    rank, keys = next(iter(ev.differing.items()))
    _, res = ev.points(rank)
    watched_objects = sorted({k.rpartition(".")[0] for k in (res or {}).get(WATCH, {})})
    streams = len((res or {}).get(RNG, {}))
    seen = ", ".join(f"'{o}'" for o in watched_objects) or "no watched object"
    which = (
        "the first resumed step"
        if ev.step == ev.split + 1
        else f"step {ev.step} (the steps before it matched)"
    )
    user = [k for k in keys if not is_audit_key(k)] or keys
    device = str(ev.res_sigs[rank].header.get("device") or "cpu") if rank in ev.res_sigs else "cpu"
    noise = (
        ""
        if device == "cpu"
        else " On an accelerator a fresh process may also pick other kernels: the noise "
        "verdict says whether this is within the measured noise."
    )
    return Diagnosis(
        f"{ev.where(rank)}: everything restored matched the uninterrupted run bit for bit at "
        f"the resume point ({seen} and {streams} random streams, at {(res or {}).get('at')}), "
        f"yet {which} computed differently ({', '.join(user[:4])}): the difference is in state "
        "the audit did not see, not in how the watched state was saved or restored. Look at: "
        "modules and buffers not given to watch(), gradient-accumulation buffers, caches and "
        "running statistics kept outside the watched objects (a loss normalizer, a feature or "
        f"KV cache), counters and flags of the training loop.{noise} Fix: save and restore "
        "that state with the checkpoint; watch() the object you suspect (or record its "
        "value) and the report names it",
        COMPUTED_DIFFERENTLY,
    )


HELD_RULES = (_micro_batches, _accumulation, consumed_data)
"""When the resume point held: only the rules that do not blame an audited object's save or
restore (the gradient-accumulation state and the data order are not audited objects). The
data comes last and always answers when the model's inputs differ (`auto:data`): inputs that
differ are never "computed differently after an exact resume"."""


def classify_at_step(ev: Evidence) -> Diagnosis:
    if held_at_resume(ev):
        found = next((d for d in (rule(ev) for rule in HELD_RULES) if d is not None), None)
        return found or _computed_differently(ev)
    for rule in STEP_RULES:
        found = rule(ev)
        if found is not None:
            return found
    return _unaudited(ev)
