"""The direct resume (`chain=True`): when chain link k > 1 breaks, one more launch resumes
from the uninterrupted run's own checkpoint at the same split. Its result informs the
chain's report (`chain.chain_text`); it never decides the test by itself."""

from __future__ import annotations

from typing import Optional

from ..plan import PlannedLaunch, Planner
from .base import Check, Judging, Verdict
from .launches import resumed_from, uninterrupted_of


class Direct(Check):
    kind = "direct"
    decisive = False

    def __init__(self, split: int, full: PlannedLaunch, launch: PlannedLaunch) -> None:
        super().__init__([launch])
        self.split, self.full, self.launch = split, full, launch
        self.asked = False

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        if not marker.chain:
            return []
        full = uninterrupted_of(planner, marker.splits[0])
        checks: list[Check] = []
        for split in marker.splits[1:]:
            name = f"resumed-split{split}-direct"
            # a direct resume is a resumed launch to the trainer (ctx.resuming)
            launch = resumed_from(planner, split, full, full, name=name, role="direct")
            launch.on_demand = True
            checks.append(cls(split, full, launch))
        return checks

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        if verdict.check == "chain" and verdict.failed and verdict.split == self.split:
            if not self.asked:
                self.asked = True
                judge.start(self.launch)

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        cmp = judge.comparator.compare(
            judge.signatures(self.full), judge.signatures(self.launch), self.split
        )
        verdict = Verdict(
            self.kind,
            "passed" if cmp.equal else "failed",
            f"direct resume from step {self.split}",
            self.split,
            comparison=cmp,
            launch=self.launch.name,
        )
        self.reach(judge, verdict)

    def final(self) -> Optional[Verdict]:
        return self.verdict

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        return []  # the chain's own report says what it showed

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        return ""
