"""Name the most likely cause of the first divergence, in words a user understands, and only
from evidence that separates it from its look-alikes.

In time order, the first difference being the cause and later ones its symptoms:
1. at the resume point (`at_resume.py`): the checkpoint, then the state right before the
   first resumed step compared with the uninterrupted run at the same program point, read
   with the restore log and the draws traced before that point;
2. at the first divergent step (`at_step.py`): what differs there, when the resume point
   does not explain it (no snapshot, or everything matched there).
"""

from __future__ import annotations

from typing import Optional

from ..compare.diff import Comparison
from ..rank.layout import WATCH, section_of
from ..signature import Signature
from .at_resume import RESUME_RULES, checkpoint_rewritten, drawn_before_restore, other_checkpoint
from .at_step import classify_at_step
from .at_step_data import inputs_note, re_executed, replay_leads
from .classes import (
    DATA_ORDER,
    DATALOADER_WORKERS,
    RESTORED_THEN_ADVANCED,
    UNAUDITED_INPUT,
    UNKNOWN,
)
from .evidence import Diagnosis, Evidence

__all__ = ["Diagnosis", "diagnose", "diagnose_resume_point"]


def diagnose(
    cmp: Comparison, base: dict[int, Signature], res: dict[int, Signature]
) -> Optional[Diagnosis]:
    """The likely cause of `cmp`'s first divergence (None when there is none). A resumed run
    whose steps are wrong (it recorded none, or others) gets a cause only when its checkpoint
    explains it, or its data shows it re-executed the steps before the split: the step
    problems say the rest."""
    if cmp.equal:
        return None
    ev = Evidence.of(cmp, base, res)
    if cmp.divergence is None:
        return other_checkpoint(ev) or checkpoint_rewritten(ev) or re_executed(ev)
    found = next((d for d in (rule(ev) for rule in RESUME_RULES) if d is not None), None)
    if found is not None and found.bug_class == RESTORED_THEN_ADVANCED:
        found = replay_leads(ev, found) or found
    if found is None:
        found = classify_at_step(ev)
        if found.bug_class in (DATA_ORDER, DATALOADER_WORKERS, UNAUDITED_INPUT, UNKNOWN):
            lead = drawn_before_restore(ev)
            if lead:
                found.notes.append(lead)
    for note in (inputs_note(ev, found), _only_other_ranks(ev)):
        if note:
            found.notes.append(note)
    return found


def diagnose_resume_point(
    cmp: Comparison, base: dict[int, Signature], res: dict[int, Signature]
) -> Optional[Diagnosis]:
    """The cause of a difference at the resume point when every later step matched (the gate
    failed, the trajectory did not): the resume-point rules alone."""
    ev = Evidence.of(cmp, base, res)
    return next((d for d in (rule(ev) for rule in RESUME_RULES) if d is not None), None)


def _only_other_ranks(ev: Evidence) -> str:
    """Ranks whose own recorded values or random streams differ, when rank 0's do not (its
    watched parameters can differ only because gradients were all-reduced with theirs)."""
    ranks = sorted(
        r for r, keys in ev.differing.items() if any(section_of(k) != WATCH for k in keys)
    )
    if not ranks or 0 in ranks:
        return ""
    many = len(ranks) > 1
    return (
        f"rank 0's recorded values and random streams match; only "
        f"{'ranks' if many else 'rank'} {', '.join(map(str, ranks))} "
        f"{'differ' if many else 'differs'}: per-rank state (RNG, data cursor, extra_state) "
        "was probably saved from rank 0 only, or keyed by local rank instead of global rank"
    )
