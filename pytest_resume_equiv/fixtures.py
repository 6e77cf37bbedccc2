"""The objects behind the `resume_equiv` and `torchrun` fixtures: their API, and the named
steps of one run (plan, run, judge, report) in `ResumeEquiv.run`."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from .checks import Plan, build_plan
from .errors import ResumeEquivError, ResumeEquivWarning
from .golden import GoldenTarget
from .judge import LaunchFailed, Outcome, run_plan
from .launch.devices import Device
from .launch.resources import LeaseWait, LeasingStarter, parallelism, with_lease
from .launch.running import LaunchResult, LaunchSpec, launch, terminate_as_interrupt
from .launch.spec import Launcher
from .launch.targets import Command, target_of
from .plan import DEFAULT_CHECKPOINT, DEFAULT_SEED, RunRequest
from .rank.launch_context import LaunchContext
from .rank.timings import mark
from .report.picture import Picture
from .report.plot import picture_of
from .report.records import RunRecord, TestRecord
from .report.text import (
    format_launch_failure,
    format_outcome,
    format_plan_summary,
    format_shutdown_deaths,
    interrupted_failure,
    outcome_failure,
)
from .schedule import Scheduler
from .settings import TestSettings
from .signature import Signature, read_run

ROLE_WORDS = {
    "uninterrupted": "uninterrupted",
    "control": "second uninterrupted (determinism control)",
    "resumed": "resumed",
    "teeth": "teeth-check",
    "interrupted": "interrupted",
}
"""How a failure report names each kind of launch."""


@dataclass
class RunRoot:
    """A private directory holding one test's run directories; kept or removed at teardown."""

    path: str
    keep: str

    def kept_text(self) -> str:
        if self.keep == "none":
            return "removed after the test: --resume-equiv-keep=none"
        return f"kept: --resume-equiv-keep={self.keep}"

    def keeps(self, failed: bool) -> bool:
        """Whether the directory stays after a test that `failed` (or not)."""
        return self.keep == "all" or (self.keep == "failed" and failed)

    def finish(self, failed: bool) -> None:
        if not self.keeps(failed):
            shutil.rmtree(self.path, ignore_errors=True)


def _shutdown_deaths(results: list[LaunchResult], strict: bool, stacklevel: int) -> str:
    """Ranks that died in interpreter shutdown after their work: the failure text when
    `strict`, else "" after a warning (the verdict stands) attributed `stacklevel` frames up
    from the caller, i.e. to the test function."""
    deaths = format_shutdown_deaths(results)
    if deaths and strict:
        return f"{deaths} (--resume-equiv-strict-shutdown makes this a failure)"
    if deaths:
        warnings.warn(ResumeEquivWarning(deaths), stacklevel=stacklevel + 1)
    return ""


def _fail(message: str) -> None:
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


class ResumeEquiv:
    """Returned by the `resume_equiv` fixture: `run(...)` the trainer and compare the runs."""

    def __init__(
        self,
        settings: TestSettings,
        device: Device,
        root: RunRoot,
        owner: str,
        shared_root: Optional[str] = None,
        golden: Optional[GoldenTarget] = None,
        report_section: Callable[[str], None] = lambda text: None,
        progress: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.settings = settings
        self.device = device
        self.root = root
        self.owner = owner
        """The test's node id."""
        self.shared_root = shared_root
        self.golden = golden
        """What this test asks of the golden store (`--resume-equiv-golden`)."""
        self.report_section = report_section
        self.progress = progress
        """Receives a line per launch event (pytest -v)."""
        self.pictures: list[Picture] = []
        """The failures' pictures, named in their texts, drawn once the test is over if its
        run directories are kept (`report/drawer.py`): a test that expected the failure
        passes, and its directories go."""
        self.runs: list[RunRecord] = []
        self.outcome: Optional[Outcome] = None
        self.launching = False
        """True while launches run: an interrupted test keeps its run directories."""
        self.wall = 0.0
        """Seconds spent in run() calls."""
        self.shared_dirs: list[str] = []
        """Shared uninterrupted launches this test used (kept with the test on a failure)."""

    @property
    def _who(self) -> str:
        """The test as the phase timings name it (rank/timings.py): its node id, one word."""
        return self.owner.replace(" ", "_").replace("/", "|")

    @property
    def steps(self) -> int:
        return self.settings.marker.steps

    @property
    def splits(self) -> tuple[int, ...]:
        return self.settings.marker.splits

    @property
    def nproc(self) -> int:
        return self.settings.marker.nproc

    @property
    def world_size(self) -> int:
        return self.settings.marker.world_size

    def run(
        self,
        command: Command,
        *,
        checkpoint: str = DEFAULT_CHECKPOINT,
        resume_args: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
        seed: int = DEFAULT_SEED,
        cwd: Optional[str] = None,
    ) -> Outcome:
        """Launch uninterrupted and resumed runs, compare every rank; fail the test on a difference.

        `command` is an argv list (a script path or `["-m", "module", ...]`, placeholders
        allowed) or a module-level `train(ctx)` function.
        """
        __tracebackhide__ = True
        if env is not None and not (
            isinstance(env, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            _fail(f"resume_equiv.run(env=...) must be a dict of str to str, got {env!r}")
        request = RunRequest(command, checkpoint, resume_args, dict(env or {}), seed, cwd)
        mark("item.run", self._who)
        try:
            plan, problem = self._plan(request), ""
        except ResumeEquivError as exc:
            plan, problem = None, f"resume_equiv.run(): {exc}"
        if plan is None:
            _fail(problem)  # outside the except block: no chained exception in the report
        mark("item.planned", self._who)
        began = time.monotonic()
        try:
            outcome, problem = self._run(plan)
        finally:
            self.wall += time.monotonic() - began
            mark("item.reported", self._who)
        if outcome is None:
            _fail(problem)
        if outcome.abstained:
            self._abstain(outcome)
        return outcome

    def _abstain(self, outcome: Outcome) -> None:
        """The resume points held, but a trajectory could not be judged within the measured
        noise: a skip saying why (a failure with --resume-equiv-strict-abstain)."""
        __tracebackhide__ = True
        reason = "; ".join(f"{v.label}: {v.why}" for v in outcome.abstained)
        if self.settings.strict_abstain:
            _fail(f"abstained (--resume-equiv-strict-abstain makes it a failure): {reason}")
        pytest.skip(f"resume-equiv abstained: {reason}")

    def _plan(self, request: RunRequest) -> Plan:
        plan = build_plan(
            self.settings, request, self.device, self.root.path, self.shared_root, self.golden
        )
        self.shared_dirs += [p.spec.run_dir for p in plan.launches if p.shared]
        for text in plan.warnings:  # before the launches: the author may stop and fix it
            warnings.warn(ResumeEquivWarning(text), stacklevel=3)
        return plan

    def _run(self, plan: Plan) -> tuple[Optional[Outcome], str]:
        """Run and judge the plan: (the outcome, "") when it passed, else (None, the failure
        text). Either way the run's record is kept for the summary and the JSON report."""
        outcome = Outcome(plan, test_id=self.owner)
        parallel, prefetch = parallelism(
            self.device,
            self.nproc,
            self.world_size,
            self.settings.launcher,
        )
        starter = LeasingStarter(self.device, self.settings.timeout, self.owner)
        scheduler = Scheduler(starter, parallel, prefetch, on_progress=self.progress)
        self.launching = True
        try:
            with terminate_as_interrupt():
                run_plan(plan, self.settings, scheduler, outcome)
        except ResumeEquivError as exc:
            self.launching = False
            return None, self._failed_to_run(outcome, exc)
        except BaseException:  # Ctrl-C, SIGTERM: keep what ran, and what it found
            stopped = scheduler.unfinished()
            why = interrupted_failure(outcome, [p.name for p in stopped])
            self.runs.append(RunRecord.of(outcome, why, stopped=stopped))
            raise
        finally:
            starter.close()  # a launch that never started gives its place in the queue up
        self.launching = False
        mark("item.launched", self._who)
        self.outcome = outcome
        self.report_section(format_plan_summary(outcome))
        for text in outcome.warnings:
            warnings.warn(ResumeEquivWarning(text), stacklevel=3)
        if not outcome.equal:
            record = RunRecord.of(outcome, outcome_failure(outcome))
            self.runs.append(record)
            record.plots = self._plots(outcome)
            text = format_outcome(outcome, self.root.kept_text())
            return None, text + "".join(f"\nplot: {path}" for path in record.plots)
        deaths = format_shutdown_deaths(outcome.launches)
        strict = bool(deaths) and self.settings.strict_shutdown
        failed = "ranks died in interpreter shutdown (strict)" if strict else ""
        self.runs.append(RunRecord.of(outcome, failed, [deaths] if deaths and not strict else []))
        failure = _shutdown_deaths(outcome.launches, self.settings.strict_shutdown, stacklevel=3)
        return (None, failure) if failure else (outcome, "")

    def _failed_to_run(self, outcome: Outcome, exc: ResumeEquivError) -> str:
        """A launch failed, or a launch's output cannot be compared: the failure text."""
        self.runs.append(RunRecord.of(outcome, str(exc)))
        self.report_section(format_plan_summary(outcome))
        if isinstance(exc, LaunchFailed):
            failure = format_launch_failure(exc.result, ROLE_WORDS.get(exc.role, exc.role))
            if exc.note:
                failure += f"\n  likely cause: {exc.note}"
            return f"{failure}\n  ({self.root.kept_text()})"
        return f"{exc}\n  (run directories in {self.root.path}, {self.root.kept_text()})"

    def _plots(self, outcome: Outcome) -> list[str]:
        """A PNG per diverged split or variant that differs (matplotlib installed, run
        directories kept)."""
        if self.root.keep == "none":
            return []
        pictures = (picture_of(verdict, self.root.path) for verdict in outcome.verdicts)
        found = [picture for picture in pictures if picture is not None]
        self.pictures.extend(found)
        return [picture.path for picture in found]

    def record(self, failed: bool) -> TestRecord:
        """This test's record for the summary table and the JSON report."""
        abstained = any(v.status == "abstained" for run in self.runs for v in run.verdicts)
        if self.launching:
            verdict = "interrupted"
        elif not self.runs:
            verdict = "not run"
        else:
            verdict = "failed" if failed else "abstained" if abstained else "passed"
        marker = self.settings.marker
        conf = marker.configurations
        return TestRecord(
            test=self.owner,
            outcome="failed" if failed else "passed",
            verdict=verdict,
            steps=marker.steps,
            splits=list(marker.splits),
            ranks=conf.baseline.nproc * conf.baseline.nnodes if conf else marker.world_size,
            resumed_ranks=marker.resumed_world_size if marker.topology_changes else 0,
            variant_ranks=conf.variant.nproc * conf.variant.nnodes if conf else 0,
            device=self.device.kind,
            wall_seconds=self.wall,
            runs=self.runs,
        )


class Torchrun:
    """Returned by the `torchrun` fixture: launch a script, `-m module` or function."""

    def __init__(
        self,
        device_for: Callable[[int, str], Device],
        timeout: float,
        root: RunRoot,
        strict_shutdown: bool = False,
        launcher: Optional[Launcher] = None,
        fork_server: bool = False,
        preload: tuple[str, ...] = (),
    ) -> None:
        self._device_for = device_for
        self.timeout = timeout
        self.root = root
        self.strict_shutdown = strict_shutdown
        self.launcher = launcher or Launcher()
        self.fork_server = fork_server
        self.preload = preload
        self._count = 0
        self._previous: list[str] = []
        """The devices the last launch leased: the next asks for them first."""

    def __call__(
        self,
        command: Command,
        *,
        nproc: int = 2,
        nnodes: int = 1,
        env: Optional[dict[str, str]] = None,
        timeout: Optional[float] = None,
        check: bool = True,
        cwd: Optional[str] = None,
    ) -> LaunchResult:
        """Run `command` under torchrun; with check=True a failed rank fails the test."""
        __tracebackhide__ = True
        for name, value in (("nproc", nproc), ("nnodes", nnodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail(f"torchrun({name}={value!r}): must be an int >= 1")
        try:
            target, problem = target_of(command), ""
        except ResumeEquivError as exc:
            problem = f"torchrun(): {exc}"
        if problem:
            _fail(problem)
        per_host = self.launcher.devices_per_host(nproc, nnodes)
        why = f"nproc={nproc} x nnodes={nnodes} simulated on this host" if per_host > nproc else ""
        device = self._device_for(per_host, why)
        self._count += 1
        name = f"launch-{self._count}"
        run_dir = os.path.join(self.root.path, name)
        context = LaunchContext("launch", run_dir, device.kind, device.backend, seed=DEFAULT_SEED)
        spec = LaunchSpec(
            name,
            target,
            run_dir,
            nproc,
            nnodes,
            float(timeout or self.timeout),
            context,
            dict(env or {}),
            cwd,
            self.launcher,
            self.fork_server,
            self.preload,
        )
        result, problem = self._launch(spec, device, per_host)
        if problem:
            _fail(problem)
        if check and not result.ok:
            _fail(format_launch_failure(result, "torchrun"))
        failure = _shutdown_deaths([result], self.strict_shutdown and check, stacklevel=2)
        if failure:
            _fail(failure)
        return result

    def _launch(
        self, spec: LaunchSpec, device: Device, per_host: int
    ) -> tuple[Optional[LaunchResult], str]:
        lease = None
        try:
            if device.kind != "cpu" and spec.launcher.leases_devices:  # Slurm: its GRES
                lease = LeaseWait(device, per_host, spec.timeout, spec.name).wait(self._previous)
                self._previous = list(lease.held)
            return launch(with_lease(spec, lease)), ""
        except ResumeEquivError as exc:
            return None, f"torchrun(): {exc}"
        finally:
            if lease is not None:
                lease.release()

    @staticmethod
    def signatures(result: LaunchResult) -> dict[int, Signature]:
        return read_run(result.spec.run_dir, result.spec.world_size)
