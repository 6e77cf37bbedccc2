"""Typed records of what each resume test ran and concluded: kept in memory during the
session, turned into JSON once at its end (the JSON report, JUnit properties, and the
records pytest-xdist workers send to the controller), and read back by `jsonable` from their
fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..checks import Verdict, kind_of
from ..checks.base import Outcome
from ..compare.configurations import ConfigurationFacts
from ..compare.jsonable import to_json
from ..launch.running import LaunchResult
from ..plan import PlannedLaunch
from ..signature import readable

REPORT_FORMAT = "pytest-resume-equiv/report"
REPORT_VERSION = 1


@dataclass
class LaunchRecord:
    name: str
    role: str
    ranks: int
    seconds: float
    startup_overlapped: float
    reused_from: Optional[str]
    ok: bool
    """The launch did what the plan asked of it: it finished with every rank ok, or it was
    killed as planned (interrupt="kill")."""
    status: str
    """ok, killed as planned, timed out, failed, interrupted."""
    timed_out: bool
    killed_after_step: int
    run_dir: str
    command: str

    @classmethod
    def stopped(cls, planned: PlannedLaunch) -> LaunchRecord:
        """A launch that was running when the test was interrupted (Ctrl-C, SIGTERM)."""
        spec = planned.spec
        return cls(
            name=planned.name,
            role=planned.role,
            ranks=spec.world_size,
            seconds=0.0,
            startup_overlapped=0.0,
            reused_from=None,
            ok=False,
            status="interrupted",
            timed_out=False,
            killed_after_step=0,
            run_dir=spec.run_dir,
            command="",
        )

    @classmethod
    def of(cls, result: LaunchResult, role: str) -> LaunchRecord:
        return cls(
            name=result.spec.name,
            role=role,
            ranks=result.spec.world_size,
            seconds=round(result.duration, 3),
            startup_overlapped=round(result.startup, 3),
            reused_from=result.reused or None,
            ok=result.status in ("ok", "killed as planned"),
            status=result.status,
            timed_out=result.timed_out,
            killed_after_step=result.killed_after_step,
            run_dir=result.spec.run_dir,
            command=result.command,
        )


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """A verdict in the JSON report: a resume's keys of report version 1 (`split`, `equal`,
    `first_divergence` in readable values, `data` and `topology` in words, ...) beside the
    verdict's own structured record, from which it is read back."""
    data = to_json(verdict)
    if not verdict.primary:
        return data
    found = next((f for f in verdict.facts if isinstance(f, ConfigurationFacts)), None)
    if verdict.comparison is None and found is not None:  # an equivalence test's variant
        return {**configurations_json(found), **data}
    cmp = verdict.comparison
    div = cmp.divergence if cmp is not None else None
    first = None
    if div is not None:
        first = {
            "step": div.step,
            "rank": div.rank,
            "key": div.key,
            "path": div.path,
            "detail": div.detail,
            "uninterrupted": readable(div.expected),
            "resumed": readable(div.actual),
        }
    words = {f.kind: to_json(f).get("text", []) for f in verdict.every_fact}
    return {
        "split": verdict.split,
        "equal": verdict.equal,
        "compared_steps": cmp.compared_steps if cmp is not None else 0,
        "problems": [p.message for p in cmp.problems] if cmp is not None else [],
        "first_divergence": first,
        "divergent_keys": {str(k): v for k, v in (cmp.divergent_keys if cmp else {}).items()},
        "data": words.get("data", []),
        "topology": words.get("topology", []),
        **data,
    }


def configurations_json(found: ConfigurationFacts) -> dict[str, Any]:
    """An equivalence test's verdict under the resume's keys: equal, the steps compared, the
    first difference by role (`baseline`, `variant`, readable, with the relative difference
    and its round-off bound for a number), every quantity that differs (over the global
    batch: no rank)."""
    first = found.differences[0] if found.differences else None
    return {
        "split": None,
        "equal": found.equal,
        "compared_steps": found.steps,
        "problems": [],
        "first_divergence": None
        if first is None
        else {
            "step": first.step,
            "rank": None,
            "key": first.what,
            "baseline": _plain(first.baseline),
            "variant": _plain(first.variant),
            "relative": first.relative,
            "bound": first.bound,
        },
        "divergent_keys": {"global batch": [d.what for d in found.differences]} if first else {},
        "data": [],
        "topology": [],
    }


def _plain(value: Any) -> Any:
    """A number or a text as it is, anything else (encoded floats, tensors) readable."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else readable(value)


@dataclass
class RunRecord:
    """One `resume_equiv.run()` call: its plan, the launches that ran, every check's verdict,
    and what failed, in a few words."""

    plan: list[str]
    launches: list[LaunchRecord] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    """Every check's verdict: the resumes (`primary`) and the checks around them."""
    failure: str = ""
    """Why the run failed, in a few words ("" when it passed)."""
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Audited items left out of the comparison on purpose."""
    plots: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        outcome: Outcome,
        failure: str = "",
        warnings: Sequence[str] = (),
        stopped: Sequence[PlannedLaunch] = (),
    ) -> RunRecord:
        """`warnings`: beside the plan's and the outcome's; `stopped`: launches that were
        running when the test was interrupted."""
        roles = {p.name: p.role for p in outcome.plan.launches}
        return cls(
            plan=[p.name for p in outcome.plan.started],
            launches=[LaunchRecord.of(r, roles.get(r.spec.name, "")) for r in outcome.launches]
            + [LaunchRecord.stopped(p) for p in stopped],
            verdicts=[*outcome.verdicts, *[v for v in outcome.checks if not v.primary]],
            failure=failure,
            warnings=[*outcome.plan.warnings, *outcome.warnings, *warnings],
            ignored=list(outcome.ignored),
        )

    def of_check(self, kind: str) -> list[Verdict]:
        return [v for v in self.verdicts if v.check == kind]

    @property
    def teeth(self) -> dict[str, str]:
        """{"status", "why"}: passed, failed, skipped, off, cancelled, not run."""
        found = self.of_check("teeth")
        return (
            {"status": found[0].status, "why": found[0].why}
            if found
            else {"status": "not run", "why": ""}
        )

    @property
    def control(self) -> dict[str, Any]:
        """{"ran", "deterministic", "first_difference"}: the determinism control."""
        found = self.of_check("control")
        odd = next((v for v in found if v.failed), None)
        return {
            "ran": bool(found),
            "deterministic": None if not found else odd is None,
            "first_difference": odd.first_difference() if odd is not None else "",
        }

    def json_extra(self) -> dict[str, Any]:
        """The resumes and the checks around them apart, each with the report's keys, and
        the teeth check and determinism control in a few words."""
        return {
            "verdicts": [verdict_json(v) for v in self.verdicts if v.primary],
            "checks": [verdict_json(v) for v in self.verdicts if not v.primary],
            "teeth": self.teeth,
            "control": self.control,
        }

    @classmethod
    def json_in(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The resumes and the checks, as one list of verdicts again."""
        return {**data, "verdicts": [*data.get("verdicts", []), *data.get("checks", [])]}


@dataclass
class TestRecord:
    """One resume test's line in the summary table and entry in the JSON report."""

    __test__ = False  # not a pytest test class
    test: str
    outcome: str
    """passed | failed (pytest's view)."""
    verdict: str
    """passed | failed | interrupted | not run (the plugin's view)."""
    steps: int
    splits: list[int]
    ranks: int
    device: str
    wall_seconds: float
    runs: list[RunRecord]
    resumed_ranks: int = 0
    """The resumed launches' world size when it differs (resume_nproc=); 0 otherwise."""
    variant_ranks: int = 0
    """An equivalence test's variant's world size (`ranks`: the baseline's); 0 otherwise."""

    @property
    def ranks_text(self) -> str:
        """ "2", "2->1" for a resume on another topology, "1 vs 2" for a baseline and its
        variant."""
        if self.variant_ranks:
            return f"{self.ranks} vs {self.variant_ranks}"
        return f"{self.ranks}->{self.resumed_ranks}" if self.resumed_ranks else str(self.ranks)

    @property
    def launches(self) -> int:
        return sum(len(run.launches) for run in self.runs)

    @property
    def reused_launches(self) -> int:
        return sum(1 for run in self.runs for launch in run.launches if launch.reused_from)

    @property
    def first_divergence(self) -> str:
        """What failed first, in a few words: why the first failed run failed."""
        return next((run.failure for run in self.runs if run.failure), "")

    def json_extra(self) -> dict[str, Any]:
        """The totals the summary table shows, for the JSON report's readers."""
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "launches": self.launches,
            "reused_launches": self.reused_launches,
            "first_divergence": self.first_divergence,
        }

    def proved(self) -> str:
        """What the test's launches showed, in one line (printed with -v after the test)."""
        parts = []
        for run in self.runs:
            ran = ", ".join(
                launch.name
                + (f" (reused: run for {launch.reused_from})" if launch.reused_from else "")
                + ("" if launch.status == "ok" else f" ({launch.status})")
                for launch in run.launches
            )
            parts.append(f"launches {ran}" if ran else "no launch ran")
            parts += [p for p in (kind_of(v.check).proved(v) for v in run.verdicts) if p]
        return f"{self.test} {self.verdict}: " + "; ".join(parts)

    def junit_properties(self) -> list[tuple[str, Any]]:
        """The test's properties in JUnit XML (strings; lists joined by " | ")."""
        causes = [
            f"{f'split {v.split}' if v.split is not None else v.label}: "
            f"{v.diagnosis.bug_class}: {v.diagnosis.text()}"
            for run in self.runs
            for v in run.verdicts
            if v.primary and v.diagnosis is not None
        ]
        teeth = [
            f"{r.teeth.get('status')}: {r.teeth.get('why', '')}".rstrip(": ") for r in self.runs
        ]
        controls = [
            "matched" if r.control.get("deterministic") else r.control.get("first_difference", "")
            for r in self.runs
            if r.control.get("ran")
        ]
        return [
            ("resume_equiv_verdict", self.verdict),
            ("resume_equiv_launches", self.launches),
            ("resume_equiv_wall_seconds", round(self.wall_seconds, 3)),
            ("resume_equiv_first_divergence", self.first_divergence),
            ("resume_equiv_likely_cause", " | ".join(causes)),
            ("resume_equiv_teeth_check", " | ".join(teeth)),
            ("resume_equiv_determinism_control", " | ".join(controls)),
            ("resume_equiv_warnings", " | ".join(w for r in self.runs for w in r.warnings)),
            ("resume_equiv_proved", self.proved()),
        ]


def report_json(records: list[TestRecord]) -> dict[str, Any]:
    """The whole JSON report of a session, tests in node-id order."""
    tests = [to_json(r) for r in sorted(records, key=lambda r: r.test)]
    return {"format": REPORT_FORMAT, "version": REPORT_VERSION, "tests": tests}
