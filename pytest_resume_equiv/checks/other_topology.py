"""The topology check (`resume_nproc=`, `resume_nnodes=`): a resume on another number of
ranks, held by the envelope comparator to what a different reduction order cannot change
(data exact over the global batch; values equal on every rank within the noise measured
between the uninterrupted runs on both topologies, `envelope.py`)."""

from __future__ import annotations

from ..compare.comparators import Run, WithinEnvelope
from ..compare.envelope import TopologyFacts
from ..compare.tolerance import ComparisonRules
from ..diagnose import Stage, cause
from ..plan import PlannedLaunch, Planner
from .base import Check, Judging, Verdict
from .launches import (
    on_resumed_topology,
    resumed_from,
    source_of,
    uninterrupted_of,
)
from .resume import ResumeLike


def judge_topology(
    reference: Run, run: Run, other: Run, split: int, rules: ComparisonRules, label: str = ""
) -> Verdict:
    """A resume on another topology against the uninterrupted run, within the noise between
    `other` (uninterrupted on the resumed topology) and it; the cause from the data."""
    cmp = WithinEnvelope(rules, other).compare(reference, run, split)
    verdict = Verdict(
        OtherTopology.kind,
        "passed" if cmp.equal else "failed",
        label or f"split {split}",
        split,
        comparison=cmp,
        primary=True,
        signatures=(reference, run),
    )
    held = next(f for f in cmp.facts if isinstance(f, TopologyFacts))
    verdict.diagnosis = cause(Stage.TOPOLOGY, (cmp, held))
    blind = held.judged_nothing()
    if cmp.equal and blind:
        verdict.status, verdict.why = "abstained", blind
    return verdict


class OtherTopology(ResumeLike):
    kind = "topology"

    def __init__(
        self,
        split: int,
        reference: PlannedLaunch,
        resumed: PlannedLaunch,
        other: PlannedLaunch,
    ) -> None:
        super().__init__(split, reference, resumed)
        self.other = other
        self.launches.append(other)

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        if not marker.topology_changes:
            return []
        checks: list[Check] = []
        for split in marker.splits:
            full = uninterrupted_of(planner, split)
            other = on_resumed_topology(planner, full)
            assert other is not None
            resumed = resumed_from(planner, split, full, source_of(planner, split))
            resumed.after = (other,)  # needed to judge it: run it first
            checks.append(cls(split, full, resumed, other))
        return checks

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        """The envelope already is the topology's measured noise."""

    def judge(self, judge: Judging) -> tuple[Verdict, dict[str, str]]:
        reference, run = judge.signatures(self.reference), judge.signatures(self.resumed)
        other = judge.signatures(self.other)
        verdict = judge_topology(reference, run, other, self.split, judge.rules)
        held = next(f for f in verdict.every_fact if isinstance(f, TopologyFacts))
        judge.warn(held.unchecked())
        return verdict, {"envelope": self.other.spec.run_dir}
