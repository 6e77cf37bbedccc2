"""The determinism control: after a resume diverged, the uninterrupted launch once more. If
the second uninterrupted run differs from the first, training is not deterministic even
without a resume, and the divergence is not the resume's to blame. It never runs for a test
whose resumes matched."""

from __future__ import annotations

from typing import Optional

from ..compare.diff import first_difference
from ..compare.noise import measure
from ..plan import PlannedLaunch, Planner
from ..signature import readable
from .base import Check, Judging, Outcome, Verdict
from .launches import control_of, uninterrupted_of

DETERMINISM_KNOBS = (
    "make training deterministic first: torch.use_deterministic_algorithms(True), "
    "CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.backends.cuda.matmul.allow_tf32 = False, seed every "
    "rank and every dataloader worker (generator= / worker_init_fn), no unseeded randomness; "
    "or give tolerance= for keys whose kernels cannot be bitwise"
)
LABEL = "determinism control"


class Control(Check):
    kind = "control"
    label = LABEL

    def __init__(self, full: PlannedLaunch, launches: list[PlannedLaunch], mode: str) -> None:
        super().__init__(list(launches))
        self.full, self.controls, self.mode = full, launches, mode
        self.asked = mode == "measure"
        self.done: set[str] = set()

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        settings = planner.settings
        checks: list[Check] = []
        for group in planner.groups():
            full = uninterrupted_of(planner, group[0])
            runs = [control_of(planner, full, k) for k in range(1, settings.noise_runs)]
            if settings.noise == "measure":  # always: the noise is known before any verdict
                for launch in runs:
                    launch.on_demand = False
            checks.append(cls(full, runs, settings.noise))
        return checks

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        """Blame the resume only if training is deterministic without one: a resume compared
        with this uninterrupted launch diverged at some step."""
        cmp = verdict.comparison
        ours = verdict.runs.get("uninterrupted") == self.full.spec.run_dir
        if verdict.primary and ours and cmp is not None and cmp.divergence is not None:
            if not self.asked:
                self.asked = True
                for launch in self.controls:
                    judge.start(launch)

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        self.done.add(launch.name)
        if len(self.done) < len(self.controls):
            return
        reference = judge.signatures(self.full)
        others = [judge.signatures(c) for c in self.controls]
        steps = judge.rules.steps
        dirs = [c.spec.run_dir for c in self.controls]
        noise = measure(reference, others, 1, steps, "uninterrupted", dirs)
        cmp = next(
            (c for c in (judge.comparator.compare(reference, o, 0) for o in others) if not c.equal),
            None,
        ) or judge.comparator.compare(reference, others[0], 0)
        verdict = Verdict(self.kind, "passed", LABEL, comparison=cmp, facts=[noise])
        verdict.launch = self.controls[0].name
        verdict.runs = {"uninterrupted": self.full.spec.run_dir}
        if cmp.equal:
            verdict.why = "a second uninterrupted run matched the first"
        elif self.mode == "off" or noise.unjudgeable or not noise.noisy:
            verdict.status = "failed"
            verdict.why = (
                f"a second uninterrupted run differs from the first: {first_difference(cmp)}"
            )
        else:
            verdict.why = (
                "the uninterrupted run does not reproduce itself bitwise, only numbers drift: "
                f"{noise.describe()}; the resumes are judged within that noise"
            )
        self.reach(judge, verdict)

    def final(self) -> Optional[Verdict]:
        return self.verdict  # never asked for: nothing to say

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        return [f"{LABEL}: {verdict.why}"]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        same = verdict.comparison is not None and verdict.comparison.equal
        return f"{LABEL} {'matched' if same else 'differed'}"

    @classmethod
    def head(cls, verdict: Verdict, outcome: Outcome) -> list[str]:
        if not verdict.failed or verdict.comparison is None:
            return []
        cmp = verdict.comparison
        div = cmp.divergence
        first = (
            f"first at step {div.step}, rank {div.rank}, key {div.key!r}: "
            f"{readable(div.expected)} vs {readable(div.actual)}"
            if div is not None
            else "; ".join(p.message for p in cmp.problems)
        )
        return [
            "training is not deterministic even without a resume: a second uninterrupted run "
            f"differs from the first ({first}); the resume is not to blame.",
            f"  {DETERMINISM_KNOBS}.",
        ]

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        return []  # its head says it

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        assert verdict.comparison is not None
        return "not deterministic without a resume: " + first_difference(verdict.comparison)
