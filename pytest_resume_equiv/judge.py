"""The judge: dispatches each finished launch to the checks that wait for it, the way
pytest-xdist's `DSession.loop_once` dispatches worker events to handlers.

It does what every launch gets (a failed launch fails the test with its role and what is
known of why; the checkpoints a finished launch should have written for the launches that
load them exist; signatures are read once), then hands the launch to each check that listed
it. Checks start and cancel launches and reach verdicts through it (`checks.Judging`); every
verdict is shown to every other check.
"""

from __future__ import annotations

import os
from typing import Optional

from .checks import Outcome, Plan, Verdict
from .compare.comparators import Run, comparator_for
from .compare.tolerance import ComparisonRules
from .errors import ResumeEquivError
from .launch.running import LaunchResult
from .plan import PlannedLaunch
from .rank.run_dir import user_files
from .rank.timings import mark
from .report.replay import judgement_of, write_judgement
from .schedule import Job, Scheduler
from .settings import TestSettings
from .signature import SignatureError, read_run


class LaunchFailed(ResumeEquivError):
    def __init__(self, result: LaunchResult, role: str, note: str = "") -> None:
        super().__init__(f"the {result.spec.name} launch failed")
        self.result = result
        self.role = role
        self.note = note
        """What the plugin knows about why (e.g. its checkpoint came from a killed launch)."""


def read_signatures(result: LaunchResult) -> Run:
    try:
        signatures = read_run(result.spec.run_dir, result.spec.world_size)
    except SignatureError as exc:
        raise ResumeEquivError(
            f"the {result.spec.name} launch left an unreadable signature: {exc}"
        ) from None
    for outcome in result.ranks:
        sig = signatures.get(outcome.rank)
        if sig is not None and outcome.ok and not sig.complete:
            how = "ends in the middle of a line" if sig.truncated_tail else "has no footer"
            raise ResumeEquivError(
                f"the {result.spec.name} launch left a truncated signature: {sig.path} {how} "
                f"although rank {outcome.rank} finished normally (the footer is written when "
                "the rank ends); the disk filled up, or something else wrote to the file"
            )
    return signatures


def missing_checkpoint(planned: PlannedLaunch, source: LaunchResult) -> str:
    """Why `planned` cannot run: the checkpoint it loads was not written; what was."""
    assert planned.source is not None and planned.checkpoint is not None
    found = [path for path, _ in user_files(planned.source.spec.run_dir)]
    listing = ", ".join(found[:12]) or "nothing but the plugin's own files"
    split = planned.split
    template = planned.source.spec.context.checkpoint_template
    if source.killed_after_step:
        who = (
            f"the interrupted run (SIGKILLed once every rank had recorded step "
            f"{source.killed_after_step}, interrupt='kill')"
        )
        advice = (
            "a checkpoint must be complete on disk before training goes on past it; one "
            "written in the background can be lost or torn when the job dies"
        )
    elif planned.source.link:
        who = f"chain link {planned.source.link} (resumed from step {planned.source.split})"
        advice = f"the trainer must save there after step {split} in a resumed run too"
    elif planned.source.role == "interrupted":
        who = f"the interrupted run (ended at step {split}, interrupt='stop')"
        advice = f"the trainer must save there after step {split}"
    else:
        who = "the uninterrupted run"
        advice = (
            f"the trainer must save there after step {split}, or pass checkpoint= with the "
            "path it does use"
        )
    return (
        f"{who} did not save a checkpoint at {planned.checkpoint} "
        f"(from checkpoint={template!r}, split={split}); {advice}. "
        f"Its run directory holds: {listing}"
    )


KILLED_SOURCE_NOTE = (
    "the checkpoint it loads was written by a launch SIGKILLed once every rank had recorded "
    "step {step} (interrupt='kill'): a checkpoint must be complete on disk before training "
    "goes on past it; one written in the background can be missing or torn when the job dies"
)


class Judge:
    """Dispatches finished launches to checks; what the checks may ask of the run."""

    def __init__(
        self,
        plan: Plan,
        settings: TestSettings,
        scheduler: Scheduler,
        outcome: Optional[Outcome] = None,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self.scheduler = scheduler
        self.outcome = outcome if outcome is not None else Outcome(plan)
        marker = settings.marker
        self.rules = ComparisonRules(
            marker.steps, settings.tolerance, marker.ignore, settings.strict_latent
        )
        self.comparator = comparator_for(self.rules)
        self._results: dict[str, LaunchResult] = {}
        self._signatures: dict[str, Run] = {}
        self._started = {p.name for p in plan.started}
        self._reached: list[Verdict] = []
        for planned in plan.started:
            scheduler.add(planned)

    # the scheduler's handler

    def on_exit(self, job: Job, result: LaunchResult) -> None:
        """What must hold before a launch waiting for this one may open its gate: it did not
        fail, and the checkpoints it should have written for the launches that load them
        exist. The scheduler then opens those gates, and calls `on_done` (which calls this
        first if the scheduler did not)."""
        planned = job.planned
        if planned.name in self._results:
            return
        self.outcome.launches.append(result)
        self._results[planned.name] = result
        steps = planned.spec.context.steps
        if planned.kill_after and planned.kill_after >= steps:
            self.warn(
                f"interrupt='kill' SIGKILLs the {planned.name} launch once every rank has "
                f"recorded step {planned.kill_after}, its last (steps={steps}): the kill cuts "
                "no training, so this split tests no kill; give the run at least split + 2 "
                "steps"
            )
        elif planned.kill_after and result.ok and not result.killed_after_step:
            self.warn(
                f"the {planned.name} launch ran to its end before the SIGKILL planned once "
                f"every rank had recorded step {planned.kill_after} could land (interrupt="
                "'kill': the host looks every 20 ms, and the training outran it): its resume "
                "loads what a finished run left, so this split tested no kill; give the steps "
                "after the split more work, or more steps"
            )
        if not result.ok and not result.killed_after_step and not planned.may_fail:
            source = planned.source
            killed = self._results.get(source.name) if source is not None else None
            step = killed.killed_after_step if killed is not None else 0
            raise LaunchFailed(
                result, planned.role, KILLED_SOURCE_NOTE.format(step=step) if step else ""
            )
        self._check_checkpoints(planned, result)

    def on_done(self, job: Job, result: LaunchResult) -> None:
        """The checks that wait for this launch judge it (read and compare signatures)."""
        planned = job.planned
        self.on_exit(job, result)
        mark("host.judging", planned.spec.run_dir)
        for check in self.plan.checks:
            if any(p is planned for p in check.launches):
                check.on_done(planned, self)
        mark("host.judged", planned.spec.run_dir)

    def _check_checkpoints(self, source: PlannedLaunch, result: LaunchResult) -> None:
        """Before any launch loads a checkpoint `source` wrote, it must exist."""
        for planned in self.plan.started:
            if planned.may_fail:
                continue  # a trainer that finds its checkpoint itself (interrupt="crash")
            if planned.source is source and not os.path.exists(planned.checkpoint or ""):
                raise ResumeEquivError(missing_checkpoint(planned, result))

    # what a check may ask (checks.Judging)

    def result(self, launch: PlannedLaunch) -> LaunchResult:
        return self._results[launch.name]

    def signatures(self, launch: PlannedLaunch) -> Run:
        if launch.name not in self._signatures:
            self._signatures[launch.name] = read_signatures(self._results[launch.name])
        return self._signatures[launch.name]

    def start(self, launch: PlannedLaunch) -> None:
        if launch.name not in self._started:
            self._started.add(launch.name)
            if all(p is not launch for p in self.plan.launches):
                self.plan.launches.append(launch)  # planned as the run went (crash points)
            self.scheduler.add(launch)

    def cancel(self, launch: PlannedLaunch) -> None:
        self.scheduler.cancel(launch)

    def verdicts(self) -> list[Verdict]:
        return list(self._reached)

    def reach(self, verdict: Verdict) -> None:
        self._reached.append(verdict)
        kept = judgement_of(verdict, self.rules)
        if kept is not None:
            write_judgement(*kept)
        for check in self.plan.checks:
            if check.verdict is not verdict:
                check.on_verdict(verdict, self)

    def say(self, text: str) -> None:
        """A progress line (with -v), as the launches' own."""
        if self.scheduler.on_progress is not None:
            self.scheduler.on_progress(text)

    def warn(self, text: str) -> None:
        if text and text not in self.outcome.warnings:
            self.outcome.warnings.append(text)

    def note_ignored(self, names: list[str]) -> None:
        for name in names:
            if name not in self.outcome.ignored:
                self.outcome.ignored.append(name)

    def note_automatic(self, names: list[str]) -> None:
        for name in names:
            if name not in self.outcome.automatic:
                self.outcome.automatic.append(name)

    def conclude(self) -> Outcome:
        """Every check's verdict, in the plan's order."""
        self.outcome.checks = [v for v in (c.final() for c in self.plan.checks) if v is not None]
        return self.outcome


def run_plan(
    plan: Plan,
    settings: TestSettings,
    scheduler: Scheduler,
    outcome: Optional[Outcome] = None,
) -> Outcome:
    """Run every launch the checks need and let them judge; raises LaunchFailed /
    ResumeEquivError on anything but a verdict. Pass `outcome` to keep what ran so far (and
    the verdicts reached) when it raises."""
    judge = Judge(plan, settings, scheduler, outcome)
    try:
        scheduler.run(judge.on_done, judge.on_exit)
    finally:
        judge.conclude()
    return judge.outcome
