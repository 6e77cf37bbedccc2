"""The first divergent step's causes in watched state (`Stage.STEP`): buffers, master weights,
the optimizer's state, other watched objects and parameters, each named from the keys that
differ there."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import (
    WATCH,
    section_of,
    watched,
    watched_part,
)
from .classes import (
    BUFFERS,
    MASTER_WEIGHTS,
    OPTIMIZER_STATE,
    WATCHED_STATE,
)
from .evidence import (
    LOW_PRECISION_GAP,
    Evidence,
    first_diff_name,
    is_optimizer,
    norm_gap,
)
from .rules import Finding, Rule, Stage

STEP = (Stage.STEP,)


def _each_key(ev: Evidence):
    for rank, keys in ev.differing.items():
        for key in keys:
            yield rank, key, ev.base[rank][ev.step], ev.res[rank][ev.step]


def buffers(ev: Evidence) -> Optional[Finding]:
    """Buffers (BatchNorm running statistics and the like) differ at the step."""
    for rank, key, a, b in _each_key(ev):
        if watched_part(key) == "buffers":
            name = first_diff_name(a.get(key), b.get(key))
            return Finding(ev.where(rank), {"buffer": name, "object": watched(key)[0]})
    return None


def _buffers_words(f: Finding) -> str:
    return (
        f"buffer {f['buffer']} of {f['object']} differs: buffers (e.g. BatchNorm running "
        "statistics) were not saved/restored, or saved from rank 0 only"
    )


def master_weights(ev: Evidence) -> Optional[Finding]:
    """The optimizer's own copies of the parameters (names it could not map to a watched
    model) differ only at low-precision rounding level."""
    for rank, key, a, b in _each_key(ev):
        obj, part = watched(key)
        if part != "params" or not is_optimizer(a, obj):
            continue
        own = {n: v for n, v in (a.get(key) or {}).items() if n.startswith("group")}
        gap = norm_gap(own, {n: (b.get(key) or {})[n] for n in own if n in (b.get(key) or {})})
        if own and gap is not None and 0 < gap < LOW_PRECISION_GAP:
            return Finding(ev.where(rank), {"gap": gap})
    return None


def _master_words(f: Finding) -> str:
    return (
        "the optimizer's own copies of the parameters (master weights) differ only at "
        f"rounding level (relative {f['gap']:.1e}): fp32 master weights were rebuilt from the "
        "low-precision model weights instead of being saved"
    )


def optimizer_state(ev: Evidence) -> Optional[Finding]:
    """An optimizer's state or hyperparameters differ at the step."""
    for rank, key, a, b in _each_key(ev):
        obj, section = watched(key)
        if section in ("state", "hyper") and is_optimizer(a, obj):
            return Finding(ev.where(rank), {"entry": first_diff_name(a.get(key), b.get(key))})
    return None


def _optimizer_words(f: Finding) -> str:
    return (
        f"the optimizer state differs ({f['entry']}): moments or step counts were not saved, "
        "or were reset after loading"
    )


def watched_object(ev: Evidence) -> Optional[Finding]:
    """Another watched object (an EMA, a loss scaler: not the model, not an optimizer)."""
    for rank, key, a, b in _each_key(ev):
        if section_of(key) != WATCH:
            continue
        obj, section = watched(key)
        if obj != "model" and not is_optimizer(a, obj) and section != "lr":
            name = first_diff_name(a.get(key), b.get(key))
            return Finding(ev.where(rank), {"label": obj, "part": section, "entry": name})
    return None


def _watched_words(f: Finding) -> str:
    return (
        f"the watched object '{f['label']}' differs ({f['part']} {f['entry']}): its state was "
        "not saved or not restored (an EMA, loss scaler or similar)"
    )


def parameters(ev: Evidence) -> Optional[Finding]:
    """Parameters differ although the recorded values matched: the optimizer's update."""
    for rank, keys in ev.differing.items():
        params = [k for k in keys if watched_part(k) == "params"]
        if params:
            a, b = ev.base[rank][ev.step], ev.res[rank][ev.step]
            return Finding(
                ev.where(rank), {"entry": first_diff_name(a.get(params[0]), b.get(params[0]))}
            )
    return None


def _parameters_words(f: Finding) -> str:
    return (
        f"parameters differ ({f['entry']}) although the recorded values matched: the optimizer "
        "state (moments, step count) was not restored exactly"
    )


ID = "step."
BUFFERS_ID, MASTER, OPTIMIZER = ID + "buffers", ID + "master-weights", ID + "optimizer-state"
WATCHED = ID + "watched-object"
STATE_RULES = (
    Rule(
        BUFFERS_ID,
        STEP,
        BUFFERS,
        buffers,
        _buffers_words,
        (ID + "unaudited-input", ID + "wrong-weights-loaded"),
    ),
    Rule(MASTER, STEP, MASTER_WEIGHTS, master_weights, _master_words, (BUFFERS_ID,)),
    Rule(OPTIMIZER, STEP, OPTIMIZER_STATE, optimizer_state, _optimizer_words, (MASTER,)),
    Rule(WATCHED, STEP, WATCHED_STATE, watched_object, _watched_words, (OPTIMIZER,)),
    Rule(ID + "parameters", STEP, OPTIMIZER_STATE, parameters, _parameters_words, (WATCHED,)),
)
"""An EMA follows the model, so the optimizer before other watched objects; parameters that
differ with nothing else last."""
