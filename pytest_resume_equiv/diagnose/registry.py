"""Every rule and note of the diagnosis, by stage, in the order each stage asks them: the one
place a cause is chosen. A new cause is a `Rule` in its stage's module (and its test rows);
this module only gathers them."""

from __future__ import annotations

from functools import cache

from .at_check import RULES as CHECK_RULES
from .at_checkpoint import RULES as CHECKPOINT_RULES
from .at_configurations import RULES as CONFIGURATION_RULES
from .at_crash import RULES as CRASH_RULES
from .at_power_loss import RULES as POWER_LOSS_RULES
from .at_preemption import RULES as PREEMPTION_RULES
from .at_resume import RULES as RESUME_POINT_RULES
from .at_resume_objects import RULES as OBJECT_RULES
from .at_resume_streams import RULES as STREAM_RULES
from .at_step import RULES as STEP_RULES
from .configuration_counts import RULES as COUNT_RULES
from .leads import NOTES as LEAD_NOTES
from .leads import RULES as LEAD_RULES
from .rules import Note, Rule, Stage, check_after, ordered

RULES: tuple[Rule, ...] = (
    *CHECKPOINT_RULES,
    *RESUME_POINT_RULES,
    *STREAM_RULES,
    *OBJECT_RULES,
    *STEP_RULES,
    *LEAD_RULES,
    *CRASH_RULES,
    *POWER_LOSS_RULES,
    *PREEMPTION_RULES,
    *CHECK_RULES,
    *CONFIGURATION_RULES,
    *COUNT_RULES,
)
NOTES: tuple[Note, ...] = LEAD_NOTES


@cache
def stage(of: Stage) -> list[Rule]:
    """The rules of stage `of`, in the order their look-alikes declare."""
    check_after(RULES)
    return ordered(RULES, of)


def leads_over(bug_class: str) -> list[Rule]:
    """The leads that replace a resume-point cause of `bug_class`, in their order."""
    return [rule for rule in stage(Stage.LEAD) if bug_class in rule.over]
