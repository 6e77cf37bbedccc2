"""The unit of the diagnosis: a `Rule` names one cause, from evidence that separates it from
its look-alikes, and nothing else.

A rule belongs to a stage (the program point or question it reads: the checkpoint, one thing
that differs at the resume point, the first divergent step, ...). Within a stage the rules
are asked in an order that comes only from their declared look-alikes (`after=`: the rules a
rule is asked after, because their evidence explains its own), ties broken by id, so a new
rule cannot silently hide one that comes after it: the tests in tests/unit/diagnose/ fail on
a cycle and on a rule that never fires on its own fixture.

`find` reads the evidence and returns a `Finding` (facts, no prose); `words` says the finding
in a sentence; the fix comes from the rule's bug class (diagnose/classes.py), the variant and
its parameters chosen by the finding. `Diagnosis` carries all of them, so the JSON report
hands a CI bot the rule, the fix and the evidence apart from the prose.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar

from ..compare.jsonable import json_key
from .fixes import fix_for

Input = TypeVar("Input")


class Stage(enum.Enum):
    """The question a rule answers, in the order the diagnosis asks them."""

    NO_DIVERGENCE = "no divergence"
    """The resumed run recorded wrong steps, not other values: which checkpoint, re-execution."""
    CHECKPOINT = "checkpoint"
    """Which checkpoint the resumed run loaded, and when it was written."""
    RESUME_POINT = "resume point"
    """Facts of the resume point read over every rank (train/eval flags)."""
    STREAM = "resume-point stream"
    """One random stream that differs at the resume point, with its restore log."""
    OBJECT = "resume-point object"
    """One watched object (module, optimizer, scheduler, loader) that differs there."""
    LEAD = "lead"
    """Evidence that leads over the cause the resume point gave (a data replay)."""
    STEP = "step"
    """The first divergent step, when the resume point explains nothing (or was not taken)."""
    HELD = "gate held"
    """The first divergent step after a resume point that matched bit for bit."""
    SOURCE = "source"
    """A resume that restored exactly what the launch that wrote its checkpoint held."""
    TOPOLOGY = "topology"
    """A resume on another number of ranks: the data over the global batch."""
    CRASH = "crash"
    """A resume after a crash inside the save."""
    FRESH_PROCESS = "resumed process"
    """A resume whose gate held and whose resumed process computes its first step otherwise."""
    NOISE = "noise"
    """A trajectory judged against measured noise."""
    CONFIGURATION = "configuration"
    """Two configurations of one training (`@equivalent`) that differ."""
    NOTE = "note"
    """Not a cause: a sentence added beside the cause of the classes it applies to."""


@dataclass
class Finding:
    """What a rule found, as facts: `where` it holds (`rank 1`, `step 5`, or ""), the
    evidence (JSON values: keys, steps, calls and the lines they were made at), and which of
    its class's fixes applies (`variant`, with the parameters in `evidence`)."""

    where: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    variant: str = ""
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.evidence[name]


@dataclass
class Diagnosis:
    """The likely cause, as the report prints it (`likely cause (<class>): <cause> Fix:
    <fix>`) and as the JSON report carries it."""

    cause: str
    """What differs and why, without the fix."""
    bug_class: str = field(metadata=json_key("class"))
    """Short name of the kind of bug, as the bug catalogue names it."""
    notes: list[str] = field(default_factory=list)
    rule: str = ""
    """The id of the rule that named it."""
    fix: str = ""
    """The one fix, from the bug class; "" where the cause is none of the trainer's."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """The cause and its fix, in one sentence the report prints."""
        return f"{self.cause}. Fix: {self.fix}" if self.fix else self.cause


@dataclass(frozen=True)
class Rule(Generic[Input]):
    """One cause: `find` reads one stage's input and returns a finding or None; `words` says
    a finding. `stages`: the stages that ask it (the data rules answer at any divergent
    step, whether the resume point held or not). `after`: the ids of the look-alikes this
    rule is asked after, in any of its stages. `always`: it answers whenever it is asked (the
    stage's last word: nothing may come after it)."""

    id: str
    stages: tuple[Stage, ...]
    bug_class: str
    find: Callable[[Input], Optional[Finding]]
    words: Callable[[Finding], str]
    after: tuple[str, ...] = ()
    always: bool = False
    over: tuple[str, ...] = ()
    """A lead (`Stage.LEAD`): the classes of the resume point's causes it leads over."""

    @property
    def doc(self) -> str:
        """What the rule reads, in its `find`'s docstring (the generated docs say it)."""
        return " ".join((self.find.__doc__ or "").split())

    def diagnosis(self, found: Finding) -> Diagnosis:
        where = f"{found.where}: " if found.where else ""
        return Diagnosis(
            where + self.words(found),
            self.bug_class,
            list(found.notes),
            self.id,
            fix_for(self.bug_class, found.variant, found.evidence),
            dict(found.evidence, where=found.where) if found.where else dict(found.evidence),
        )


@dataclass(frozen=True)
class Note(Generic[Input]):
    """Not a cause: a sentence `say` adds beside a cause of the classes it applies to (all
    but `unless`, or only `classes` when given), "" when it has nothing to add."""

    id: str
    say: Callable[[Input, Diagnosis], str]
    classes: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()

    def applies(self, found: Diagnosis) -> bool:
        if self.classes and found.bug_class not in self.classes:
            return False
        return found.bug_class not in self.unless


class RuleOrderError(ValueError):
    """Rules whose declared look-alikes cannot be ordered (a cycle, an unknown id)."""


def check_after(rules: Iterable[Rule]) -> None:
    """Every id an `after=` names is a rule of one of its stages."""
    rules = list(rules)
    for rule in rules:
        known = {r.id for r in rules if set(r.stages) & set(rule.stages)}
        unknown = [i for i in rule.after if i not in known]
        if unknown:
            raise RuleOrderError(f"{rule.id}: after= names {unknown}, not rules of its stages")


def ordered(rules: Iterable[Rule], stage: Stage) -> list[Rule]:
    """The rules of `stage` in the order their `after=` declares (look-alikes of other
    stages left out), ties by id; a rule that always answers comes last."""
    waiting = {rule.id: rule for rule in rules if stage in rule.stages}
    done: list[Rule] = []
    while waiting:
        ready = sorted(
            (r for r in waiting.values() if all(i not in waiting for i in r.after)),
            key=lambda r: (r.always, r.id),
        )
        if not ready:
            raise RuleOrderError(f"a cycle among after= of {sorted(waiting)}")
        done.append(ready[0])
        del waiting[ready[0].id]
    return done


def first(rules: list[Rule[Input]], subject: Input) -> Optional[Diagnosis]:
    """The diagnosis of the first rule (in `ordered` order) that finds something in `subject`."""
    for rule in rules:
        found = rule.find(subject)
        if found is not None:
            return rule.diagnosis(found)
    return None
