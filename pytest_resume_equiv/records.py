"""Typed records of what each resume test ran and concluded: kept in memory during the
session, turned into JSON once at its end (the JSON report, JUnit properties, and the
records pytest-xdist workers send to the controller).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from .compare import Comparison
from .launch import LaunchResult
from .orchestrate import ResumeOutcome
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
    timed_out: bool
    killed_after_step: int
    run_dir: str
    command: str

    @classmethod
    def of(cls, result: LaunchResult, role: str) -> LaunchRecord:
        return cls(
            name=result.spec.name,
            role=role,
            ranks=result.spec.world_size,
            seconds=round(result.duration, 3),
            startup_overlapped=round(result.startup, 3),
            reused_from=result.reused or None,
            ok=result.ok,
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

    @classmethod
    def of(cls, split: int, cmp: Comparison) -> VerdictRecord:
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
            split=split,
            equal=cmp.equal,
            compared_steps=cmp.compared_steps,
            problems=[p.message for p in cmp.problems],
            first_divergence=first,
            divergent_keys={str(k): keys for k, keys in cmp.divergent_keys.items()},
        )

    def summary(self) -> str:
        """The first divergence in a few words ("" when equal)."""
        div = self.first_divergence
        if div:
            return f"split {self.split}: step {div['step']}, rank {div['rank']}, {div['key']!r}"
        if self.problems:
            return f"split {self.split}: {self.problems[0]}"
        return ""


@dataclass
class RunRecord:
    """One `resume_equiv.run()` call: its plan, the launches that ran, the verdicts."""

    plan: list[str]
    launches: list[LaunchRecord] = field(default_factory=list)
    verdicts: list[VerdictRecord] = field(default_factory=list)
    error: str = ""
    plots: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, outcome: ResumeOutcome, error: str = "") -> RunRecord:
        roles = {p.name: p.role for p in outcome.plan.all_launches}
        return cls(
            plan=[p.name for p in outcome.plan.launches],
            launches=[LaunchRecord.of(r, roles.get(r.spec.name, "")) for r in outcome.launches],
            verdicts=[VerdictRecord.of(v.split, v.comparison) for v in outcome.verdicts],
            error=error,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        return cls(
            plan=list(data["plan"]),
            launches=[LaunchRecord(**x) for x in data["launches"]],
            verdicts=[VerdictRecord(**x) for x in data["verdicts"]],
            error=data.get("error", ""),
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

    @property
    def launches(self) -> int:
        return sum(len(run.launches) for run in self.runs)

    @property
    def reused_launches(self) -> int:
        return sum(1 for run in self.runs for launch in run.launches if launch.reused_from)

    @property
    def first_divergence(self) -> str:
        for run in self.runs:
            for verdict in run.verdicts:
                if verdict.summary():
                    return verdict.summary()
            if run.error:
                return run.error
        return ""

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

    def junit_properties(self) -> list[tuple[str, Any]]:
        return [
            ("resume_equiv_verdict", self.verdict),
            ("resume_equiv_launches", self.launches),
            ("resume_equiv_wall_seconds", round(self.wall_seconds, 3)),
            ("resume_equiv_first_divergence", self.first_divergence),
        ]


def report_json(records: list[TestRecord]) -> dict[str, Any]:
    """The whole JSON report of a session, tests in node-id order."""
    tests = [r.to_json() for r in sorted(records, key=lambda r: r.test)]
    return {"format": REPORT_FORMAT, "version": REPORT_VERSION, "tests": tests}
