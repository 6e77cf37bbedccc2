"""Name the most likely cause of the first divergence, in words a user understands, and only
from evidence that separates it from its look-alikes.

The rules (registry.py, one per cause) are asked stage by stage, in time order, the first
difference being the cause and later ones its symptoms:
1. at the resume point: the checkpoint, the train/eval flags, then the state right before the
   first resumed step compared with the uninterrupted run at the same program point, one
   stream or object at a time (a data replay leads over a stream it explains);
2. at the first divergent step, when the resume point does not explain the divergence (no
   snapshot, or everything matched there: then only causes that blame nothing audited).
Notes are added last.
"""

from __future__ import annotations

from typing import Optional

from ..compare.configurations import ConfigurationFacts
from ..compare.diff import Comparison
from ..compare.gate import GateFacts
from ..signature import Signature
from .at_check import Judged
from .at_resume import state_at_resume
from .evidence import Evidence
from .registry import NOTES, leads_over, stage
from .rules import Diagnosis, Stage, first
from .subject import held_at_resume

__all__ = [
    "Diagnosis",
    "Stage",
    "cause",
    "diagnose",
    "diagnose_configurations",
    "diagnose_resume",
    "diagnose_resume_point",
]


def cause(of: Stage, subject: object) -> Optional[Diagnosis]:
    """The cause the rules of stage `of` find in `subject` (the input that stage reads:
    at_check.py says which), None when none does."""
    return first(stage(of), subject)


def diagnose_configurations(found: ConfigurationFacts) -> Optional[Diagnosis]:
    """The likely cause of a difference between two configurations (None when equal)."""
    if found.equal or found.short:
        return None
    chosen: Optional[Diagnosis] = None
    for rule in stage(Stage.CONFIGURATION):  # each asked once, in the stage's order
        if chosen is not None and rule.always:
            continue  # the last word is for a difference nothing else explains
        finding = rule.find(found)
        if finding is None:
            continue
        said = rule.diagnosis(finding)
        if chosen is None:
            chosen = said
        else:  # the other causes the evidence shows, said beside the first
            chosen.notes.append(f"also ({said.bug_class}): {said.text()}")
    return chosen


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
        return first(stage(Stage.CHECKPOINT), ev) or first(stage(Stage.NO_DIVERGENCE), ev)
    found = _at_resume_point(ev)
    if found is None:
        found = first(stage(Stage.HELD if held_at_resume(ev) else Stage.STEP), ev)
    assert found is not None, "the step stages end with a rule that always answers"
    for note in NOTES:
        said = note.say(ev, found) if note.applies(found) else ""
        if said:
            found.notes.append(said)
    return found


def diagnose_resume(
    cmp: Comparison,
    base: dict[int, Signature],
    res: dict[int, Signature],
    held: GateFacts,
    against_uninterrupted: Optional[GateFacts] = None,
) -> Optional[Diagnosis]:
    """The cause of a resume's verdict, stage after stage: a launch that wrote the checkpoint
    wrong (the resume restored exactly what it held, `held`, and that is not the uninterrupted
    run's state, `against_uninterrupted`); the resume point alone, when only it differs; the
    resumed process's own compute, when the state loaded exactly; else the first divergence."""
    if against_uninterrupted is not None and not cmp.equal:
        found = cause(Stage.SOURCE, (held, against_uninterrupted))
        if found is not None:
            return found
    if cmp.equal and held.failed:
        return diagnose_resume_point(cmp, base, res)
    own = cause(Stage.FRESH_PROCESS, Judged(held, cmp, runs=(base, res)))
    return own or diagnose(cmp, base, res)


def diagnose_resume_point(
    cmp: Comparison, base: dict[int, Signature], res: dict[int, Signature]
) -> Optional[Diagnosis]:
    """The cause of a difference at the resume point when every later step matched (the gate
    failed, the trajectory did not): the resume-point stages alone."""
    return _at_resume_point(Evidence.of(cmp, base, res), lead=False)


def _at_resume_point(ev: Evidence, lead: bool = True) -> Optional[Diagnosis]:
    found = (
        first(stage(Stage.CHECKPOINT), ev)
        or first(stage(Stage.RESUME_POINT), ev)
        or state_at_resume(ev, stage(Stage.STREAM), stage(Stage.OBJECT))
    )
    if found is None or not lead:
        return found
    leading = first(leads_over(found.bug_class), ev)
    if leading is None:
        return found
    leading.notes.append(f"also: {found.text()}")
    return leading
