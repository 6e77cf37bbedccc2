"""Causes read from the first divergent step itself (`Stage.STEP`): the fallback when the
resume point does not explain the divergence (no snapshot, or nothing differs there); and,
after a resume point that held bit for bit (`Stage.HELD`), only the causes that do not blame
an audited object's save or restore.

Asked in the order in which one cause can explain another: the micro-batches a step took, a
random stream or the learning rate change everything computed after them, then the data, then
parameters and values. The data rules are in at_step_data.py, the stream and optimizer
ones in step_state.py."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import RNG, WATCH, is_audit_key, watched, watched_part
from .at_step_data import DATA_RULES, unseen_input, unseen_input_words
from .classes import (
    COMPUTED_DIFFERENTLY,
    GRADIENT_ACCUMULATION,
    TORN_CHECKPOINT,
    TRAIN_EVAL_FLAGS,
    UNAUDITED_INPUT,
    UNAUDITED_STATE,
)
from .evidence import (
    LOSS_KEY,
    Evidence,
    first_diff_name,
    is_optimizer,
    lost_micro_batches,
    optimizer_steps_differ,
)
from .rules import Finding, Rule, Stage
from .step_state import STATE_RULES
from .step_streams import LR_PARTS, LR_RULES, STREAM_RULES
from .subject import point_value

STEP, HELD = (Stage.STEP,), (Stage.STEP, Stage.HELD)


def window_lost(ev: Evidence) -> Optional[Finding]:
    """Automatic recording: the first resumed optimizer step took the last of the micro-batches
    the uninterrupted run accumulated for it, bit for bit (its losses are theirs): the
    micro-batches before the save were done, their gradients were not in the checkpoint."""
    if ev.step != ev.split + 1:
        return None
    for rank in ev.differing:
        base = ev.base[rank][ev.step].get(LOSS_KEY)
        lost = lost_micro_batches(base, ev.res[rank][ev.step].get(LOSS_KEY))
        if lost:
            return Finding(ev.where(rank), {"lost": lost, "micro_batches": len(base)}, "window")
    return None


def _window_lost_words(f: Finding) -> str:
    n, kept = f["lost"], f["micro_batches"] - f["lost"]
    return (
        f"the first resumed optimizer step took the last {kept} of the {f['micro_batches']} "
        "micro-batches the uninterrupted run accumulated for it (their losses match bit for "
        f"bit): the accumulated gradients of the {n} micro-batch{'es' * (n != 1)} before the "
        "save were lost (the checkpoint was written in the middle of the accumulation window, "
        "without them)"
    )


def micro_batches(ev: Evidence) -> Optional[Finding]:
    """Automatic recording: the optimizer step took another number of micro-batches (one
    `backward()` each) in the resumed run: the accumulation restarted out of phase."""
    for rank in ev.differing:
        base = ev.base[rank][ev.step].get(LOSS_KEY)
        res = ev.res[rank][ev.step].get(LOSS_KEY)
        if isinstance(base, list) and isinstance(res, list) and len(base) != len(res):
            return Finding(ev.where(rank), {"resumed": len(res), "uninterrupted": len(base)})
    return None


def _micro_words(f: Finding) -> str:
    n = f["resumed"]
    return (
        f"the optimizer step took {n} micro-batch{'es' * (n != 1)} (backward calls) in the "
        f"resumed run and {f['uninterrupted']} in the uninterrupted run: the "
        "gradient-accumulation micro-step counter was not restored as saved (restored in "
        "optimizer steps, or reset), so the resumed run accumulates out of phase"
    )


def accumulation(ev: Evidence) -> Optional[Finding]:
    """The optimizer stepped a different number of times (its per-parameter step counts
    differ), and the scheduler with it."""
    for rank, keys in ev.differing.items():
        lr = [k for k in keys if watched_part(k) in LR_PARTS]
        if lr and optimizer_steps_differ(ev.base, ev.res, rank, ev.step, keys):
            return Finding(ev.where(rank), variant="steps")
    return None


def _accumulation_words(f: Finding) -> str:
    return (
        "the optimizer and the LR scheduler stepped a different number of times (the "
        "optimizer's step count differs): the gradient-accumulation micro-step counter or the "
        "partially accumulated gradients were not restored"
    )


def modes(ev: Evidence) -> Optional[Finding]:
    """Train/eval flags that differ at the step."""
    for rank, keys in ev.differing.items():
        for key in keys:
            if watched_part(key) == "modes":
                a, b = ev.base[rank][ev.step].get(key) or [], ev.res[rank][ev.step].get(key) or []
                return Finding(ev.where(rank), {"modules": sorted(set(a) ^ set(b))})
    return None


def _modes_words(f: Finding) -> str:
    return (
        f"module train/eval flags differ ({', '.join(f['modules'])} in eval mode in one run "
        "only): a submodule's mode is not the same after the resume"
    )


def _first_step_weights(ev: Evidence) -> Optional[tuple[int, list[str], list[str], bool]]:
    """At the first resumed step: the rank, its recorded values and model parameters that
    differ, and whether those parameters matched at the resume point."""
    for rank, keys in ev.differing.items():
        user = [k for k in keys if not is_audit_key(k)]
        params = [
            k
            for k in keys
            if watched_part(k) == "params"
            and not is_optimizer(ev.base[rank][ev.step], watched(k)[0])
        ]
        if ev.step == ev.split + 1 and user and params:
            base, res = ev.points(rank)
            matched = bool(base and res) and all(
                point_value(base, k) == point_value(res, k) for k in params
            )
            return rank, user, params, matched
    return None


def input_unseen(ev: Evidence) -> Optional[Finding]:
    """The weights were right when the first resumed step began (they matched at the resume
    point), and the step still computed something else: an input the audit does not see."""
    found = _first_step_weights(ev)
    if found is None or not found[3]:
        return None
    return unseen_input(ev, found[0], found[1])


def wrong_weights(ev: Evidence) -> Optional[Finding]:
    """Recorded values and parameters already differ at the first resumed step while every
    stream, the learning rate and the data match: the loaded weights are not those at the save."""
    found = _first_step_weights(ev)
    if found is None or found[3]:
        return None
    rank, user, params, _ = found
    name = first_diff_name(
        ev.base[rank][ev.step].get(params[0]), ev.res[rank][ev.step].get(params[0])
    )
    return Finding(ev.where(rank), {"values": user, "parameter": name}, variant="unsure")


def _wrong_weights_words(f: Finding) -> str:
    return (
        f"the recorded values ({', '.join(f['values'])}) and parameters ({f['parameter']}) "
        "already differ at the first resumed step while every RNG stream, the learning rate "
        "and the data match: the loaded weights are not the weights at save time (an "
        "asynchronous or torn checkpoint written after the tensors changed, or the wrong "
        "checkpoint loaded)"
    )


def unaudited(ev: Evidence) -> Optional[Finding]:
    """Only what the user recorded differs, and nothing audited explains it."""
    rank, keys = next(iter(ev.differing.items()))
    return Finding(ev.where(rank), {"values": [k for k in keys if not is_audit_key(k)]})


def _unaudited_words(f: Finding) -> str:
    return (
        f"recorded values differ ({', '.join(f['values'])}) while every audited RNG stream and "
        "watched state matches: state the audit does not see was not restored (data loader "
        "position, per-rank counters, a custom object)"
    )


def computed_differently(ev: Evidence) -> Optional[Finding]:
    """Everything audited matched at the resume point, yet a resumed step computed something
    else: the cause is in what the audit did not see, never in how a watched object or an
    audited stream was saved or restored (that would contradict the resume point)."""
    rank, keys = next(iter(ev.differing.items()))
    _, res = ev.points(rank)
    sig = ev.res_sigs.get(rank)
    return Finding(
        ev.where(rank),
        {
            "watched": sorted({k.rpartition(".")[0] for k in (res or {}).get(WATCH, {})}),
            "streams": len((res or {}).get(RNG, {})),
            "at": (res or {}).get("at"),
            "step": ev.step,
            "first": ev.step == ev.split + 1,
            "values": ([k for k in keys if not is_audit_key(k)] or keys)[:4],
            "device": str(sig.header.get("device") or "cpu") if sig else "cpu",
        },
    )


def _computed_words(f: Finding) -> str:
    seen = ", ".join(f"'{o}'" for o in f["watched"]) or "no watched object"
    which = (
        "the first resumed step"
        if f["first"]
        else f"step {f['step']} (the steps before it matched)"
    )
    noise = (
        ""
        if f["device"] == "cpu"
        else " On an accelerator a fresh process may also pick other kernels: the noise "
        "verdict says whether this is within the measured noise."
    )
    return (
        "everything restored matched the uninterrupted run bit for bit at the resume point "
        f"({seen} and {f['streams']} random streams, at {f['at']}), yet {which} computed "
        f"differently ({', '.join(f['values'])}): the difference is in state the audit did not "
        "see, not in how the watched state was saved or restored. Look at: modules and buffers "
        "not given to watch(), gradient-accumulation buffers, caches and running statistics "
        "kept outside the watched objects (a loss normalizer, a feature or KV cache), counters "
        f"and flags of the training loop.{noise}"
    ).rstrip(".")


MICRO, WINDOW = "step.micro-batches", "step.accumulation-window"
LOST = "step.accumulation-window-lost"
MODES, UNSEEN = "step.train-eval-flags", "step.unaudited-input"
WEIGHTS = "step.wrong-weights-loaded"
DATA = tuple(rule.id for rule in DATA_RULES)
LAST_STREAM = tuple(rule.id for rule in STREAM_RULES)
RULES = (
    Rule(LOST, HELD, GRADIENT_ACCUMULATION, window_lost, _window_lost_words),
    Rule(MICRO, HELD, GRADIENT_ACCUMULATION, micro_batches, _micro_words, (LOST,)),
    *STREAM_RULES,
    Rule(
        WINDOW,
        HELD,
        GRADIENT_ACCUMULATION,
        accumulation,
        _accumulation_words,
        (MICRO, *LAST_STREAM),
    ),
    *LR_RULES,
    *DATA_RULES,
    Rule(MODES, STEP, TRAIN_EVAL_FLAGS, modes, _modes_words, DATA),
    Rule(UNSEEN, STEP, UNAUDITED_INPUT, input_unseen, unseen_input_words, (MODES,)),
    Rule(WEIGHTS, STEP, TORN_CHECKPOINT, wrong_weights, _wrong_weights_words, (MODES,)),
    *STATE_RULES,
    Rule("step.unaudited-state", STEP, UNAUDITED_STATE, unaudited, _unaudited_words, always=True),
    Rule(
        "held.computed-differently",
        (Stage.HELD,),
        COMPUTED_DIFFERENTLY,
        computed_differently,
        _computed_words,
        always=True,
    ),
)
