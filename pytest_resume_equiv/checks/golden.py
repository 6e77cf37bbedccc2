"""The golden trajectory: the uninterrupted run against the golden kept for this test and
environment (`--resume-equiv-golden DIR`). A resume test compares two runs of the same code,
so a change that moves both alike (a new init, a data order, a dependency) passes it; this
check catches it, through the test's comparator (its tolerance) and, when a determinism
control measured noise, within that noise.

With `--resume-equiv-update-golden` it writes the golden instead (and the checkpoints of
`golden_checkpoint=True`) and says so.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..compare.comparators import NOISE_FACTOR, Measured, Run
from ..compare.diff import format_comparison
from ..compare.noise import NoiseFacts
from ..errors import ResumeEquivError
from ..golden import Golden, GoldenTarget, size_words
from ..plan import PlannedLaunch, Planner
from ..signature import SignatureError, read_run
from .base import Check, Judging, Outcome, Verdict
from .launches import control_of, one_group, uninterrupted_of

LABEL = "golden trajectory"
SIDES = ("golden", "uninterrupted")
GROUPS = (
    "golden_checkpoint=True needs one uninterrupted launch that saves at every split: the "
    "command must not use {split} (the checkpoint= path may)"
)


def read_golden(golden: Golden, world_size: int) -> Run:
    """The golden's signatures (JSON), or a clear error naming the file."""
    try:
        return read_run(golden.path, world_size)
    except SignatureError as exc:
        raise ResumeEquivError(f"the golden store: unreadable golden signature: {exc}") from None


def update_command(target: GoldenTarget) -> str:
    return (
        f"pytest {target.test!r} --resume-equiv-golden={target.store.root} "
        "--resume-equiv-update-golden"
    )


class GoldenTrajectory(Check):
    kind = "golden"
    label = LABEL

    def __init__(self, target: GoldenTarget, full: PlannedLaunch, golden: Optional[Golden]):
        super().__init__([full])
        self.target, self.full, self.golden = target, full, golden
        self.controls: list[PlannedLaunch] = []
        """The determinism control of `full`: does training reproduce itself at all?"""
        self.checkpoints: dict[int, str] = {}
        """split -> the checkpoint the uninterrupted run wrote there, to store
        (`golden_checkpoint=True`, update runs)."""

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        target = planner.golden
        if target is None:
            return []
        full = uninterrupted_of(planner, planner.marker.splits[0])
        check = cls(target, full, None if target.update else target.load())
        if planner.settings.noise != "off":  # asked for when the golden differs
            runs = range(1, planner.settings.noise_runs)
            check.controls = [control_of(planner, full, k) for k in runs]
        if target.update and planner.marker.golden_checkpoint:
            one_group(planner, GROUPS)
            for split in planner.marker.splits:
                source = uninterrupted_of(planner, split)
                values = {**source.spec.context.template_values, "split": split}
                check.checkpoints[split] = planner.checkpoint_of(values)
        return [check]

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        if self.target.update:
            self.write(judge)
            return
        if self.golden is None:
            self.reach(judge, self.verdict_of("failed", self.target.missing()))
            return
        cmp = judge.comparator.compare(self.reference(), judge.signatures(self.full), 0)
        verdict = self.verdict_of("passed" if cmp.equal else "failed", self.written_by())
        verdict.comparison = cmp
        self.reach(judge, verdict)
        if verdict.failed:  # the noise of training itself, if it has some, is measured
            for control in self.controls:
                judge.start(control)
        for other in judge.verdicts():  # noise measured before the uninterrupted run ended
            self.on_verdict(other, judge)

    def reference(self) -> Run:
        assert self.golden is not None
        return read_golden(self.golden, self.golden.meta.world_size)

    def written_by(self) -> str:
        assert self.golden is not None
        return f"golden {self.golden.meta.written_by()}"

    def verdict_of(self, status: str, why: str) -> Verdict:
        verdict = Verdict(self.kind, status, LABEL, why=why, launch=self.full.name)
        verdict.runs = {"golden": self.target.path, "uninterrupted": self.full.spec.run_dir}
        verdict.rerun = update_command(self.target)
        return verdict

    def write(self, judge: Judging) -> None:
        marker = judge.settings.marker
        spec = self.full.spec
        written = self.target.write(spec.run_dir, spec.world_size, marker.steps, self.checkpoints)
        if written is None:
            why = f"update run: the golden {self.target.key} was already written in this session"
        else:
            sizes = ", ".join(
                f"split {s}: {size_words(written.size(s))}" for s in sorted(self.checkpoints)
            )
            why = f"update run: wrote the golden {self.target.key} to {written.path}" + (
                f" (checkpoints {sizes})" if sizes else ""
            )
        self.reach(judge, self.verdict_of("skipped", why))

    def on_verdict(self, verdict: Verdict, judge: Judging) -> None:
        """A determinism control measured noise: a failed exact judgement again within it."""
        mine = self.verdict
        if mine is None or not mine.failed or mine.comparison is None:
            return
        if verdict.check != "control" or verdict.status != "passed":
            return
        if verdict.runs.get("uninterrupted") != self.full.spec.run_dir:
            return
        noise = next((f for f in verdict.facts if isinstance(f, NoiseFacts)), None)
        if noise is None or not noise.noisy or noise.unjudgeable or judge.settings.noise == "off":
            return
        cmp = Measured(judge.rules, noise).compare(self.reference(), judge.signatures(self.full), 0)
        how = f"within {NOISE_FACTOR:g}x the measured noise ({noise.describe()})"
        again = dataclasses.replace(
            mine,
            status="passed" if cmp.equal else "failed",
            comparison=cmp,
            why=f"{self.written_by()}; {'' if cmp.equal else 'not '}{how}",
            facts=[noise],
        )
        self.reach(judge, again)

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        cmp = verdict.comparison
        if cmp is None or verdict.status not in ("passed", "failed"):
            return [f"{LABEL} {verdict.status}: {verdict.why}"]
        first = format_comparison(cmp, LABEL, SIDES).splitlines()[0]
        return [f"{first} ({verdict.why})"]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        cmp = verdict.comparison
        if verdict.status == "passed" and cmp is not None:
            return f"{LABEL} equal to the golden over {cmp.compared_steps} steps"
        return f"{LABEL} {verdict.status}" + (f" ({verdict.why})" if verdict.why else "")

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        cmp = verdict.comparison
        golden = verdict.runs.get("golden", "")
        if cmp is None:
            return [f"{LABEL}: {verdict.why}", f"  golden store: {golden}"]
        return [
            f"{LABEL}: the uninterrupted run differs from the {verdict.why}: something moved "
            "the training itself (the resumed run moves alike, so a resume test alone cannot "
            "see it): an init, the data order, a dtype, a dependency",
            format_comparison(cmp, LABEL, SIDES),
            f"  golden: {golden}",
            f"  uninterrupted: {verdict.runs.get('uninterrupted', '')} ({kept})",
            f"  if the change is intended, rewrite the golden and commit it:\n    {verdict.rerun}",
        ]

    @classmethod
    def head(cls, verdict: Verdict, outcome: Outcome) -> list[str]:
        """Beside a failed resume, this failure opens the report (it is not a resume's)."""
        return cls.block(verdict, outcome, "kept") if verdict.failed else []

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        first = verdict.first_difference()
        return f"{LABEL}: {first}" if first else f"{LABEL}: {verdict.why}"
