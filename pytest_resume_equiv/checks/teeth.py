"""The teeth check: can this test catch an RNG resume bug at all? One more resumed launch
mutates every random stream right after its first step; if what the user recorded still
matches the uninterrupted run, the signature does not depend on random state and the test
has no teeth. It runs only where it can matter: not after a divergence, and not when no
audited stream advances after the split."""

from __future__ import annotations

import os
from typing import Optional

from ..compare.comparators import Comparator, Run, WithinEnvelope
from ..compare.envelope import TopologyFacts
from ..plan import PlannedLaunch, Planner
from ..rank.layout import RNG, section_of
from .base import Check, Judging, Outcome, Verdict
from .launches import on_resumed_topology, resumed_from, source_of, uninterrupted_of

TEETH_ADVICE = (
    "give it some: keep dropout on (p > 0) in the trained model, record values that depend on "
    "random state (the sampled noise, timesteps, augmentation), or pass rng_mutation=False if "
    "the training really uses no randomness"
)
TOPOLOGY_ADVICE = (
    "on another topology only values that are the same on every rank are compared, so record "
    "some that depend on random state and the training (the loss after an all-reduce) and "
    "watch(model=..., optimizer=...) under data parallelism (its replicated parameters and "
    "optimizer state are compared too); turning the check off would not make the comparison "
    "see more"
)
LABEL = "teeth check"


def rng_advances_after(signatures: Run, split: int) -> bool:
    """Whether any audited RNG stream moves after the first resumed step on some rank: if none
    does, an RNG restore bug cannot change the run, and a mutation could not either."""
    for sig in signatures.values():
        steps = sig.by_step()
        ordered = sorted(s for s in steps if s >= split + 1)
        audited = False
        for before, after in zip(ordered, ordered[1:]):
            for key, value in steps[after].items():
                if section_of(key) == RNG:
                    audited = True
                    if steps[before].get(key) != value:
                        return True
        if not audited:
            return True  # nothing audited (too few steps, or audit off): keep the check
    return False


class Teeth(Check):
    kind = "teeth"
    label = LABEL

    def __init__(
        self,
        split: Optional[int],
        full: Optional[PlannedLaunch] = None,
        launch: Optional[PlannedLaunch] = None,
        other: Optional[PlannedLaunch] = None,
        off: str = "",
    ) -> None:
        super().__init__([p for p in (full, launch, other) if p is not None])
        self.split, self.full, self.launch, self.other = split, full, launch, other
        self.off = off

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        settings, marker = planner.settings, planner.marker
        if not settings.rng_mutation:
            return [cls(None, off=f"rng_mutation=False from {settings.sources['rng_mutation']}")]
        if marker.interrupt == "crash":
            return [cls(None, off='interrupt="crash": the crash points are the test')]
        split = next((s for g in planner.groups() for s in g if marker.steps >= s + 2), None)
        if split is None:
            return [
                cls(None, off="needs steps >= split + 2 (a step after the mutated one to compare)")
            ]
        full = uninterrupted_of(planner, split)
        source = source_of(planner, split)
        if marker.chain and split != marker.splits[0]:
            before = marker.splits[marker.splits.index(split) - 1]
            source = planner.planned[f"resumed-split{before}"]  # the link that saves there
        name = f"teeth-split{split}"
        launch = resumed_from(planner, split, full, source, name=name, role="teeth", phase="teeth")
        other = on_resumed_topology(planner, full)
        if other is not None:
            launch.after = (other,)
        return [cls(split, full, launch, other)]

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        if self.verdict is not None:
            return
        if launch is self.full and self.split is not None:
            if not rng_advances_after(judge.signatures(launch), self.split):
                self._end(
                    judge,
                    "skipped",
                    "no audited RNG stream advances after the split: nothing random for a "
                    "resume to get wrong",
                )
        elif launch is self.launch and self.full is not None and self.split is not None:
            comparator: Comparator = judge.comparator
            if self.other is not None:
                comparator = WithinEnvelope(judge.rules, judge.signatures(self.other))
            check = comparator.compare(
                judge.signatures(self.full),
                judge.signatures(launch),
                self.split,
                skip_steps=1,
                user_only=True,
            )
            status, why = (
                ("failed", "the recorded values still matched with every RNG stream mutated")
                if check.equal
                else ("passed", "mutating every RNG stream changed the recorded values")
            )
            blind = next(
                (f.judged_nothing() for f in check.facts if isinstance(f, TopologyFacts)), ""
            )
            if check.equal and blind:  # it could see nothing: no verdict on its teeth
                status, why = "skipped", f"the comparison on another topology is {blind}"
            verdict = Verdict(self.kind, status, LABEL, self.split, why, comparison=check)
            verdict.launch = launch.name
            verdict.runs = {"teeth": launch.spec.run_dir}
            if self.other is not None:
                verdict.runs["topology"] = self.other.spec.run_dir
            self.reach(judge, verdict)

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        if verdict.primary and verdict.failed and self.verdict is None and self.launch:
            self._end(judge, "cancelled", f"the resume from step {verdict.split} diverged")

    def _end(self, judge: Judging, status: str, why: str) -> None:
        """The check ends without running: it could not matter, or no longer can."""
        if self.launch is not None:
            judge.cancel(self.launch)
        self.reach(judge, Verdict(self.kind, status, LABEL, self.split, why))

    def final(self) -> Verdict:
        if self.verdict is not None:
            return self.verdict
        if self.off:
            return Verdict(self.kind, "off", LABEL, why=self.off)
        return Verdict(self.kind, "not run", LABEL, self.split)

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        check = verdict.comparison
        assert check is not None
        return [
            "this test has no teeth: every RNG stream was mutated right after step "
            f"{check.split + 1} of a resumed run (launch {verdict.launch}), and the recorded "
            f"values at steps {check.split + 2}-{check.steps} still matched the uninterrupted "
            f"run on all {check.world_size} ranks, so the signature does not depend on random "
            f"state and this test cannot catch RNG resume bugs; "
            f"{TOPOLOGY_ADVICE if verdict.runs.get('topology') else TEETH_ADVICE}.",
            f"run directories ({kept}): {os.path.dirname(verdict.runs.get('teeth', ''))}",
        ]

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        return "no teeth: the recorded values matched with every RNG stream mutated"
