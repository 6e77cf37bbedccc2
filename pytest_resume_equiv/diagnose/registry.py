"""Every rule and note of the diagnosis, by stage, in the order each stage asks them: the one
place a cause is chosen. A new cause is a `Rule` in its stage's module (and its test rows);
this module only gathers them."""

from __future__ import annotations

from functools import cache

from . import (
    at_check,
    at_checkpoint,
    at_resume,
    at_resume_objects,
    at_resume_streams,
    at_step,
    leads,
)
from .rules import Note, Rule, Stage, check_after, ordered

RULES: tuple[Rule, ...] = (
    *at_checkpoint.RULES,
    *at_resume.RULES,
    *at_resume_streams.RULES,
    *at_resume_objects.RULES,
    *at_step.RULES,
    *leads.RULES,
    *at_check.RULES,
)
NOTES: tuple[Note, ...] = leads.NOTES


@cache
def stage(of: Stage) -> list[Rule]:
    """The rules of stage `of`, in the order their look-alikes declare."""
    check_after(RULES)
    return ordered(RULES, of)


def leads_over(bug_class: str) -> list[Rule]:
    """The leads that replace a resume-point cause of `bug_class`, in their order."""
    return [rule for rule in stage(Stage.LEAD) if bug_class in rule.over]
