"""The resumed-process repeat: noise that only a fresh process has (another kernel picked,
autotuning), told apart from a restore bug.

When a resume's state loaded exactly (the gate held), the uninterrupted run reproduces itself
(the determinism control matched) and still the very first resumed step differs at rounding
level, one more launch resumes from the same checkpoint. How far the two resumed processes
drift apart is the noise the first is judged within (`within_noise.py`); two that agree bit
for bit leave nothing to judge against, and the trajectory abstains. Only with
`noise="auto"` or `"measure"`.
"""

from __future__ import annotations

from typing import Optional

from ..compare.noise import measure
from ..plan import PlannedLaunch, Planner
from .base import Check, Judging, Verdict
from .launches import resumed_from, source_of, uninterrupted_of
from .within_noise import fresh_process


class Repeat(Check):
    kind = "repeat"
    decisive = False

    def __init__(self, split: int, first: PlannedLaunch, launch: PlannedLaunch) -> None:
        super().__init__([launch])
        self.split, self.first, self.launch = split, first, launch
        self.suspect: Optional[Verdict] = None
        """The resume that looks like a fresh process computing differently."""
        self.deterministic = False
        self.asked = False

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        crash = marker.interrupt == "crash"  # its resumes start where the trainer chooses
        if planner.settings.noise == "off" or marker.topology_changes or marker.chain or crash:
            return []
        checks: list[Check] = []
        for split in marker.splits:
            full, source = uninterrupted_of(planner, split), source_of(planner, split)
            first = resumed_from(planner, split, full, source)
            name = f"{first.name}-repeat"
            launch = resumed_from(planner, split, full, source, name=name, role="repeat")
            launch.on_demand = True
            checks.append(cls(split, first, launch))
        return checks

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        if verdict.primary and verdict.split == self.split and verdict.failed:
            if fresh_process(verdict) is not None:
                self.suspect = verdict
        elif verdict.check == "control" and verdict.comparison is not None:
            self.deterministic = verdict.comparison.equal
        if self.suspect is not None and self.deterministic and not self.asked:
            self.asked = True
            judge.start(self.launch)

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        first, again = judge.signatures(self.first), judge.signatures(launch)
        noise = measure(
            first, [again], self.split + 1, judge.rules.steps, "resumed", [launch.spec.run_dir]
        )
        verdict = Verdict(
            self.kind,
            "passed",
            f"resumed-process repeat from step {self.split}",
            self.split,
            why=noise.describe(),
            facts=[noise],
            launch=launch.name,
        )
        self.reach(judge, verdict)

    def final(self) -> Optional[Verdict]:
        return self.verdict

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        return [f"{verdict.label}: {verdict.why}"]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        return f"{verdict.label}: {verdict.why}"
