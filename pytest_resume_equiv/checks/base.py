"""The unit of the plugin: a check. It plans the launches it needs, handles them when they
finish, compares through a comparator and reaches one `Verdict`; the verdict renders itself
through its check's class (in reports, the JSON report, JUnit and the `-v` line).

A check sees the run only through `Judging` (what the judge lets it do: read a finished
launch's signatures, start an on-demand launch, cancel one, reach its verdict, warn), so each
check is unit-tested with a fake judge and synthetic signatures, without torchrun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Protocol

from ..compare.comparators import Comparator, Run
from ..compare.diff import Comparison, first_difference
from ..compare.facts import Fact
from ..compare.jsonable import NOT_IN_JSON, json_key
from ..compare.tolerance import ComparisonRules
from ..diagnose import Diagnosis
from ..launch.running import LaunchResult
from ..plan import PlannedLaunch, Planner

STATUSES = ("passed", "failed", "abstained", "skipped", "off", "cancelled", "not run")
"""passed / failed / abstained: judged; skipped: it could not matter; off: not asked for;
cancelled: another verdict made it moot; not run: the test ended before it could run."""


@dataclass
class Verdict:
    """What one check concluded: one type for every check, JSON-round-trippable (`jsonable`)."""

    check: str
    """The kind of check (`Check.kind`)."""
    status: str
    """One of STATUSES."""
    label: str
    """How reports name it: "split 3", "chain link 2 (...)", "teeth check"."""
    split: Optional[int] = None
    why: str = ""
    """In a few words, why it ended so (a skipped, off or cancelled check's reason)."""
    comparison: Optional[Comparison] = None
    diagnosis: Optional[Diagnosis] = field(default=None, metadata=json_key("likely_cause"))
    facts: list[Fact] = field(default_factory=list)
    primary: bool = False
    """A resume the test proves (one per split, or per link of a chain), as opposed to a
    check of the test itself (teeth, determinism control, direct resume)."""
    link: int = field(default=0, metadata=json_key("chain_link"))
    """chain=True: which resume of the chain (1, 2, ...); 0 outside a chain."""
    launch: str = ""
    """The judged launch's name."""
    runs: dict[str, str] = field(default_factory=dict)
    """Run directories by role ("uninterrupted", "resumed"), for the report."""
    rerun: str = ""
    """A shell line that reruns the judged launch by hand."""
    values_match: bool = False
    """Only audited state differs: every value the user recorded matched at every step."""
    signatures: Optional[tuple[Run, Run]] = field(
        default=None, compare=False, repr=False, metadata=NOT_IN_JSON
    )
    """(reference, judged) as compared, in the test's process only (plots); not in JSON."""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def equal(self) -> bool:
        return self.comparison is not None and self.comparison.equal

    @property
    def every_fact(self) -> list[Fact]:
        """What the comparison established, then what the check itself did."""
        found = self.comparison.facts if self.comparison is not None else []
        return [*found, *self.facts]

    def first_difference(self) -> str:
        return first_difference(self.comparison) if self.comparison is not None else ""


class Judging(Protocol):
    """What the judge lets a check do while the launches run."""

    rules: ComparisonRules
    comparator: Comparator
    """The comparator of the test's own topology, bound to its rules."""
    settings: Any
    """The test's settings (`settings.TestSettings`)."""

    def verdicts(self) -> list[Verdict]:
        """The verdicts reached so far, latest of each check last."""
        ...

    def signatures(self, launch: PlannedLaunch) -> Run:
        """The finished launch's signatures (read once, validated)."""
        ...

    def result(self, launch: PlannedLaunch) -> LaunchResult: ...

    def start(self, launch: PlannedLaunch) -> None:
        """Run an on-demand launch (once, however often asked)."""
        ...

    def cancel(self, launch: PlannedLaunch) -> None: ...

    def reach(self, verdict: Verdict) -> None:
        """The check's verdict: recorded, and shown to every other check."""
        ...

    def say(self, text: str) -> None:
        """Tell the user now what the test is about to do (a progress line, with -v)."""
        ...

    def warn(self, text: str) -> None: ...

    def note_ignored(self, names: list[str]) -> None: ...

    def note_automatic(self, names: list[str]) -> None: ...


class Check:
    """One check of a resume test: its launches, its handlers, its verdict and how that
    verdict reads. Subclasses register in `checks.CHECKS`."""

    kind: ClassVar[str] = ""
    decisive: ClassVar[bool] = True
    """Whether a failed verdict of this kind fails the test (a direct resume only informs)."""
    label: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _KINDS[cls.kind] = cls

    def __init__(self, launches: list[PlannedLaunch]) -> None:
        self.launches = launches
        """The launches whose end this check handles (planned by it, or shared)."""
        self.verdict: Optional[Verdict] = None

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        """The checks of this kind the test has (none by default), with their launches."""
        return []

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        """One of this check's launches finished (ok, or killed as planned)."""

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        """Another check reached `verdict`."""

    def reach(self, judge: Judging, verdict: Verdict) -> None:
        self.verdict = verdict
        judge.reach(verdict)

    def final(self) -> Optional[Verdict]:
        """This check's verdict once the run is over (a check that never got to judge says
        why, or says nothing)."""
        return self.verdict

    # How a verdict of this kind reads: class methods, so verdicts read back from JSON (a
    # pytest-xdist worker's) render the same.

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        """The verdict in the plan summary of a run."""
        status = verdict.status
        name = f" ({verdict.launch})" if verdict.launch and status in ("passed", "failed") else ""
        return [f"{verdict.label} {status}{name}" + (f": {verdict.why}" if verdict.why else "")]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        """The verdict in the one `-v` line after the test ("" to say nothing)."""
        return f"{verdict.label} {verdict.status}" + (f" ({verdict.why})" if verdict.why else "")

    @classmethod
    def head(cls, verdict: Verdict, outcome: Outcome) -> list[str]:
        """Lines that open a failure report in place of the default first line, when this
        verdict failed beside a failed resume."""
        return []

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        """This failed verdict's part of the failure report."""
        return [f"{verdict.label} failed" + (f": {verdict.why}" if verdict.why else "")]

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        """Why the test failed, in a few words (the summary table), for a failed verdict."""
        return f"{verdict.label}: {verdict.first_difference() or verdict.why}"


_KINDS: dict[str, type[Check]] = {}
"""Every check class by its `kind`, filled as the classes are defined."""


def kind_of(kind: str) -> type[Check]:
    """The check class behind a verdict's `check` (a verdict read back from JSON too)."""
    return _KINDS.get(kind, Check)


@dataclass
class Plan:
    launches: list[PlannedLaunch] = field(default_factory=list)
    """Every launch a check may need, in start order (those that load no checkpoint first)."""
    checks: list[Check] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the test author should know before the launches start."""

    @property
    def started(self) -> list[PlannedLaunch]:
        """The launches that always run (the on-demand ones only when a check asks)."""
        return [p for p in self.launches if not p.on_demand]

    def by_role(self, role: str) -> list[PlannedLaunch]:
        return [p for p in self.launches if p.role == role]

    def named(self, name: str) -> Optional[PlannedLaunch]:
        return next((p for p in self.launches if p.name == name), None)


@dataclass
class Outcome:
    """What one `resume_equiv.run()` ran and concluded."""

    plan: Plan
    launches: list[LaunchResult] = field(default_factory=list)
    checks: list[Verdict] = field(default_factory=list)
    """Every check's verdict, in the plan's order (those that never got to judge say why)."""
    warnings: list[str] = field(default_factory=list)
    """What the author should know though it does not fail the test (latent streams, a
    training that changes nothing)."""
    ignored: list[str] = field(default_factory=list)
    """Audited items left out of the comparison (`ignore=`, `track(..., ignore=True)`)."""
    automatic: list[str] = field(default_factory=list)
    """What automatic recording recorded with no call in the trainer (`auto:loss`,
    `watch:optimizer`, ...)."""
    test_id: str = ""
    """The test's pytest node id, for a line that reruns part of it."""

    @property
    def verdicts(self) -> list[Verdict]:
        """The resumes the test proves: one per split (or per link of a chain)."""
        return sorted((v for v in self.checks if v.primary), key=lambda v: (v.split, v.link))

    @property
    def teeth(self) -> Verdict:
        found = next((v for v in self.checks if v.check == "teeth"), None)
        return found if found is not None else Verdict("teeth", "not run", "teeth check")

    @property
    def nondeterministic(self) -> Optional[Comparison]:
        """A second uninterrupted run's difference from the first, when there was one."""
        found = next((v for v in self.checks if v.check == "control" and v.failed), None)
        return found.comparison if found is not None else None

    @property
    def failed(self) -> list[Verdict]:
        """The verdicts that fail the test: those of the checks that decide, then the resumes."""
        failed = [v for v in self.checks if v.failed and kind_of(v.check).decisive]
        return [*[v for v in failed if not v.primary], *[v for v in failed if v.primary]]

    @property
    def abstained(self) -> list[Verdict]:
        """Resumes whose trajectory could not be judged within the measured noise."""
        return [v for v in self.verdicts if v.status == "abstained"]

    @property
    def resume_equal(self) -> bool:
        return bool(self.verdicts) and all(v.equal for v in self.verdicts)

    @property
    def equal(self) -> bool:
        """The test passes (or abstains): it judged a resume, and no check that decides
        failed."""
        return bool(self.verdicts) and not self.failed
