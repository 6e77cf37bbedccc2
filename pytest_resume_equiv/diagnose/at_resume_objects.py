"""The causes of one watched object (module, optimizer, LR scheduler, data loader, any other)
that differs at the resume point (`Stage.OBJECT`), read with the restore log."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import split_key, watch_key, watched_part
from .at_resume_loader import LOADER_RULE
from .at_resume_streams import _other_rank_words, other_rank_saved
from .classes import (
    BUFFERS,
    LR_SCHEDULER_OFF_BY_ONE,
    OBJECT_KINDS,
    OPTIMIZER_STATE_MISSING,
    RESTORED_AT_REDUCED_PRECISION,
    RESTORED_FROM_ANOTHER_RANK,
    RESTORED_FROM_ANOTHER_STEP,
    TORN_CHECKPOINT,
    WATCHED_STATE,
    kind_never_restored,
)
from .evidence import LOW_PRECISION_GAP, first_diff_name, norm_gap
from .rules import Finding, Rule, Stage
from .subject import Subject, equal_to_step, point_value

STAGE = (Stage.OBJECT,)
KINDS = {"module": "the module", "optimizer": "the optimizer", "scheduler": "the LR scheduler"}
NEVER_RESTORED_WORDS = {
    "optimizer": "its moments, step counts and learning rates start over",
    "scheduler": "the learning-rate schedule starts over (warmup restarts)",
    "module": "its weights and buffers are the initial ones",
}


def never_restored_of(kind: str):
    def never_restored(s: Subject) -> Optional[Finding]:
        """No load_state_dict call restored the object. DCP's load writes tensors in place,
        unlogged (weights and optimizer moments, never a scheduler's counters: a Stateful
        scheduler in the load is a logged load_state_dict), so a module or an optimizer is
        never called unrestored after one."""
        if s.kind != kind or s.restores or (s.in_place and kind != "scheduler"):
            return None
        return Finding(s.where(), {"kind": kind, "label": s.label})

    return never_restored


def _never_restored_words(f: Finding) -> str:
    return (
        f"{KINDS[f['kind']]} '{f['label']}' was never restored (no load_state_dict call "
        f"restored it): {NEVER_RESTORED_WORDS[f['kind']]}"
    )


def _equal_to_other_step(s: Subject, later: bool) -> Optional[Finding]:
    part = {"module": "params", "optimizer": "state"}.get(s.kind)
    step = equal_to_step(s.ev, s.rank, s.label, part) if part else None
    if step is None or (step > s.ev.split) != later:
        return None
    return Finding(s.where(), {"label": s.label, "part": part, "step": step, "split": s.ev.split})


def from_later_step(s: Subject) -> Optional[Finding]:
    """The object at the resume point equals the uninterrupted run's after a later step than
    the split: the checkpoint's contents are from a later step than it claims (a staging
    race: a background or asynchronous save read the live tensors after training changed
    them)."""
    return _equal_to_other_step(s, later=True)


def _later_words(f: Finding) -> str:
    what = "its state (moments, step counts)" if f["part"] == "state" else "its parameters"
    return (
        f"the checkpoint saved at step {f['split']} holds '{f['label']}' ({what}) as it was "
        f"after step {f['step']}: its contents are from a later step than it claims, a "
        "staging race (the save read the live tensors after training had changed them: a "
        "background or asynchronous save that did not copy them when it staged)"
    )


def from_earlier_step(s: Subject) -> Optional[Finding]:
    """The object at the resume point equals the uninterrupted run's after an earlier step:
    an older checkpoint was loaded."""
    return _equal_to_other_step(s, later=False)


def _earlier_words(f: Finding) -> str:
    return (
        f"'{f['label']}' at the resume point is the uninterrupted run's state after step "
        f"{f['step']}, not step {f['split']}: an older checkpoint was loaded"
    )


def optimizer_partial(s: Subject) -> Optional[Finding]:
    """An optimizer whose state has no entries for some parameters, or other step counts."""
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
    return Finding(s.where(), {"label": s.label, "empty": empty[:3], "steps_differ": steps[:1]})


def _partial_words(f: Finding) -> str:
    what = (
        f"no entries for {', '.join(f['empty'])}"
        if f["empty"]
        else f"step counts differ ({f['steps_differ'][0]})"
    )
    return (
        f"the optimizer state of '{f['label']}' is missing or partial at the resume point ({what})"
    )


def reduced_precision(s: Subject) -> Optional[Finding]:
    """Parameters (a module's, or an optimizer's own copies) that differ at the resume point
    only at low-precision rounding level."""
    for key in (k for k in s.keys if watched_part(k) == "params"):
        gap = norm_gap(point_value(s.base, key), point_value(s.res, key))
        if gap is not None and 0 < gap < LOW_PRECISION_GAP:
            return Finding(s.where(), {"label": s.label, "kind": s.kind, "gap": gap})
    return None


def _precision_words(f: Finding) -> str:
    what = (
        f"the optimizer's own copies of the parameters ('{f['label']}': master weights)"
        if f["kind"] == "optimizer"
        else f"the parameters of '{f['label']}'"
    )
    return (
        f"at the resume point {what} differ only at low-precision rounding level (relative "
        f"{f['gap']:.1e}): restored at reduced precision"
    )


def scheduler_shifted(s: Subject) -> Optional[Finding]:
    """An LR scheduler one step ahead of or behind the uninterrupted run's at the resume point."""
    key = watch_key(s.label, "last_epoch")
    a, b = point_value(s.base, key), point_value(s.res, key)
    if s.kind != "scheduler" or not isinstance(a, int) or not isinstance(b, int) or abs(a - b) != 1:
        return None
    return Finding(s.where(), {"label": s.label, "ahead": b > a})


def _shifted_words(f: Finding) -> str:
    return (
        f"the LR scheduler '{f['label']}' is "
        f"{'one step ahead' if f['ahead'] else 'one step behind'} at the resume point: it was "
        "stepped again after loading, or saved before its step"
    )


def buffers_only(s: Subject) -> Optional[Finding]:
    """A module whose weights were restored and whose buffers differ."""
    if s.kind != "module" or [watched_part(k) for k in s.keys] != ["buffers"]:
        return None
    key = s.keys[0]
    name = first_diff_name(point_value(s.base, key), point_value(s.res, key))
    return Finding(s.where(), {"label": s.label, "buffer": name})


def _buffers_words(f: Finding) -> str:
    return (
        f"the weights of '{f['label']}' were restored but buffer {f['buffer']} differs at the "
        "resume point: buffers (BatchNorm running statistics) were left out of the saved or "
        "loaded state (strict=False?), or saved from rank 0 only"
    )


def restored_wrong(s: Subject) -> Optional[Finding]:
    """Restored (or loaded in place), and still not the uninterrupted run's state."""
    key = s.keys[0]
    name = first_diff_name(point_value(s.base, key), point_value(s.res, key))
    last = s.restores[-1] if s.restores else None
    return Finding(
        s.where(),
        {
            "label": s.label,
            "part": split_key(key)[1],
            "entry": name,
            "restore": [last["call"], last["at"]] if last else None,
        },
    )


def _restored_wrong_words(f: Finding) -> str:
    how = f" (restored by {f['restore'][0]} at {f['restore'][1]})" if f["restore"] else ""
    entry = f" {f['entry']}" if f["entry"] else ""
    return (
        f"'{f['label']}'{how} differs from the uninterrupted run's at the resume point "
        f"({f['part']}{entry}): its state was not restored as saved"
    )


ID = "resume.object."
FROM_OTHER_RANK = ID + "from-another-rank"
NEVER = {kind: f"{ID}{kind}-never-restored" for kind in OBJECT_KINDS}
LATER, EARLIER = ID + "from-a-later-step", ID + "from-an-earlier-step"
PARTIAL = ID + "optimizer-state-partial"
RULES = (
    Rule(FROM_OTHER_RANK, STAGE, RESTORED_FROM_ANOTHER_RANK, other_rank_saved, _other_rank_words),
    LOADER_RULE,
    *(
        Rule(
            NEVER[kind],
            STAGE,
            kind_never_restored(kind),
            never_restored_of(kind),
            _never_restored_words,
            after=(FROM_OTHER_RANK,),
        )
        for kind in OBJECT_KINDS
    ),
    Rule(
        LATER,
        STAGE,
        TORN_CHECKPOINT,
        from_later_step,
        _later_words,
        (NEVER["module"], NEVER["optimizer"]),
    ),
    Rule(
        EARLIER,
        STAGE,
        RESTORED_FROM_ANOTHER_STEP,
        from_earlier_step,
        _earlier_words,
        after=(NEVER["module"], NEVER["optimizer"]),
    ),
    Rule(
        PARTIAL, STAGE, OPTIMIZER_STATE_MISSING, optimizer_partial, _partial_words, (LATER, EARLIER)
    ),
    Rule(
        ID + "restored-at-reduced-precision",
        STAGE,
        RESTORED_AT_REDUCED_PRECISION,
        reduced_precision,
        _precision_words,
        after=(PARTIAL,),
    ),
    Rule(
        ID + "scheduler-off-by-one",
        STAGE,
        LR_SCHEDULER_OFF_BY_ONE,
        scheduler_shifted,
        _shifted_words,
        after=(NEVER["scheduler"],),
    ),
    Rule(ID + "buffers-left-out", STAGE, BUFFERS, buffers_only, _buffers_words, (LATER, EARLIER)),
    Rule(
        ID + "restored-wrong",
        STAGE,
        WATCHED_STATE,
        restored_wrong,
        _restored_wrong_words,
        always=True,
    ),
)
"""The causes of a watched object that differs at the resume point; `restored-wrong` is the
last word."""
