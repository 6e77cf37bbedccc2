"""Typed records of what each resume test ran and concluded: kept in memory during the
session, turned into JSON once at its end (the JSON report, JUnit properties, and the
records pytest-xdist workers send to the controller).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .compare import first_difference
from .launch import LaunchResult
from .orchestrate import ResumeOutcome, SplitVerdict
from .plan import PlannedLaunch
from .values import readable

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


@dataclass
class VerdictRecord:
    split: int
    equal: bool
    compared_steps: int
    problems: list[str]
    first_divergence: Optional[dict[str, Any]]
    divergent_keys: dict[str, list[str]]
    likely_cause: Optional[dict[str, Any]] = None
    """{"class", "cause", "notes"}: the diagnosis of the first divergence, when there is one."""
    data: list[str] = field(default_factory=list)
    """The data accounting in words, per sample-id key."""
    chain_link: int = 0
    """chain=True: which resume of the chain (1, 2, ...); 0 outside a chain."""
    topology: list[str] = field(default_factory=list)
    """A resume on another topology: what it was held to, in words (data, envelopes)."""

    @classmethod
    def of(cls, verdict: SplitVerdict) -> VerdictRecord:
        cmp, diag = verdict.comparison, verdict.diagnosis
        div = cmp.divergence
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
        return cls(
            split=verdict.split,
            equal=cmp.equal,
            compared_steps=cmp.compared_steps,
            problems=[p.message for p in cmp.problems],
            first_divergence=first,
            divergent_keys={str(k): keys for k, keys in cmp.divergent_keys.items()},
            likely_cause=None
            if diag is None
            else {"class": diag.bug_class, "cause": diag.cause, "notes": list(diag.notes)},
            data=[item.text() for item in verdict.data],
            chain_link=verdict.link,
            topology=[] if verdict.topology is None else verdict.topology.lines(),
        )


@dataclass
class RunRecord:
    """One `resume_equiv.run()` call: its plan, the launches that ran, the verdicts, the
    checks around them, and what failed, in a few words."""

    plan: list[str]
    launches: list[LaunchRecord] = field(default_factory=list)
    verdicts: list[VerdictRecord] = field(default_factory=list)
    teeth: dict[str, str] = field(default_factory=dict)
    """{"status", "why"}: passed, failed, skipped, off, cancelled, not run."""
    control: dict[str, Any] = field(default_factory=dict)
    """{"ran", "deterministic", "first_difference"}: the determinism control."""
    failure: str = ""
    """Why the run failed, in a few words ("" when it passed)."""
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Audited items left out of the comparison on purpose."""
    plots: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        outcome: ResumeOutcome,
        failure: str = "",
        warnings: Sequence[str] = (),
        stopped: Sequence[PlannedLaunch] = (),
    ) -> RunRecord:
        """`warnings`: beside the plan's and the outcome's; `stopped`: launches that were
        running when the test was interrupted."""
        roles = {p.name: p.role for p in outcome.plan.all_launches}
        ran_control = any(roles.get(r.spec.name) == "control" for r in outcome.launches)
        odd = outcome.nondeterministic
        teeth = outcome.teeth
        return cls(
            plan=[p.name for p in outcome.plan.launches],
            launches=[LaunchRecord.of(r, roles.get(r.spec.name, "")) for r in outcome.launches]
            + [LaunchRecord.stopped(p) for p in stopped],
            verdicts=[VerdictRecord.of(v) for v in outcome.verdicts],
            teeth={
                "status": "not run" if teeth.status == "planned" else teeth.status,
                "why": teeth.why,
            },
            control={
                "ran": ran_control,
                "deterministic": None if not ran_control else odd is None,
                "first_difference": first_difference(odd) if odd is not None else "",
            },
            failure=failure,
            warnings=[*outcome.plan.warnings, *outcome.warnings, *warnings],
            ignored=list(outcome.ignored),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        return cls(
            plan=list(data["plan"]),
            launches=[LaunchRecord(**x) for x in data["launches"]],
            verdicts=[VerdictRecord(**x) for x in data["verdicts"]],
            teeth=dict(data.get("teeth", {})),
            control=dict(data.get("control", {})),
            failure=data.get("failure", ""),
            warnings=list(data.get("warnings", [])),
            ignored=list(data.get("ignored", [])),
            plots=list(data.get("plots", [])),
        )


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

    @property
    def ranks_text(self) -> str:
        """ "2", or "2->1" for a resume on another topology."""
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

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["wall_seconds"] = round(self.wall_seconds, 3)
        data.update(
            launches=self.launches,
            reused_launches=self.reused_launches,
            first_divergence=self.first_divergence,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["runs"] = [RunRecord.from_json(run) for run in data["runs"]]
        return cls(**fields)

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
            for verdict in run.verdicts:
                if verdict.equal:
                    steps = verdict.compared_steps
                    parts.append(f"split {verdict.split} equal over {steps} steps")
            status = run.teeth.get("status", "not run")
            why = run.teeth.get("why", "")
            parts.append(f"teeth check {status}" + (f" ({why})" if why else ""))
            if run.control.get("ran"):
                same = run.control.get("deterministic")
                parts.append("determinism control " + ("matched" if same else "differed"))
        return f"{self.test} {self.verdict}: " + "; ".join(parts)

    def junit_properties(self) -> list[tuple[str, Any]]:
        """The test's properties in JUnit XML (strings; lists joined by " | ")."""
        causes = [
            f"split {v.split}: {v.likely_cause['class']}: {v.likely_cause['cause']}"
            for run in self.runs
            for v in run.verdicts
            if v.likely_cause
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
    tests = [r.to_json() for r in sorted(records, key=lambda r: r.test)]
    return {"format": REPORT_FORMAT, "version": REPORT_VERSION, "tests": tests}
