"""The objects behind the `resume_equiv` and `torchrun` fixtures."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import pytest

from .devices import Device, DeviceLease, visible_ids
from .launch import LaunchResult, LaunchSpec, RunningLaunch, launch, terminate_as_interrupt
from .orchestrate import (
    DEFAULT_CHECKPOINT,
    Handle,
    LaunchFailed,
    PlanInputs,
    PlannedLaunch,
    ResumeEquivError,
    ResumeOutcome,
    ResumePlan,
    Starter,
    argv_list,
    build_plan,
    execute,
    run_context,
    target_from_argv,
    target_from_callable,
)
from .plot import plot_split
from .report import (
    format_launch_failure,
    format_outcome,
    format_plan_summary,
    format_shutdown_deaths,
    outcome_json,
)
from .settings import MarkerSpec, Resolved
from .share import SharedBaseline
from .signature import Signature, read_run

Command = Union[Sequence[str], Callable[..., Any]]
ROLES = {
    "baseline": "uninterrupted",
    "control": "second uninterrupted (determinism control)",
    "resumed": "resumed",
    "teeth": "teeth-check",
    "interrupted": "interrupted",
}
"""How a failure report names each kind of launch."""
DEFAULT_SEED = 1234


@dataclass
class RunRoot:
    """A private directory holding one test's run directories; kept or removed at teardown."""

    path: str
    keep: str

    def kept_text(self) -> str:
        if self.keep == "none":
            return "removed after the test: --resume-equiv-keep=none"
        return f"kept: --resume-equiv-keep={self.keep}"

    def finish(self, failed: bool) -> None:
        if self.keep == "all" or (self.keep == "failed" and failed):
            return
        shutil.rmtree(self.path, ignore_errors=True)


def _lease(device: Device, n: int, timeout: float) -> Optional[DeviceLease]:
    if device.kind == "cpu":
        return None
    lease = DeviceLease(device.kind, visible_ids(device.kind, device.count))
    lease.acquire(n, timeout)
    return lease


class ResumeEquivWarning(UserWarning):
    """Something the test author should know that does not change the verdict."""


class LeasedLaunch:
    """A launch holding its devices until it ends."""

    def __init__(self, running: RunningLaunch, lease: DeviceLease) -> None:
        self._running = running
        self._lease = lease

    @property
    def running(self) -> bool:
        return self._running.running

    def open_gate(self) -> None:
        self._running.open_gate()

    def poll(self) -> Optional[LaunchResult]:
        result = self._running.poll()
        if result is not None:
            self._lease.release()
        return result

    def kill(self) -> None:
        try:
            self._running.kill()
        finally:
            self._lease.release()


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
        prepared: Any,
        root: RunRoot,
        report_section: Callable[[str], None],
        shared_root: Optional[str] = None,
        owner: str = "",
    ) -> None:
        self.spec: MarkerSpec = prepared.spec
        self.device: Device = prepared.device
        self.timeout: Resolved = prepared.timeout
        self.rng_mutation: bool = prepared.rng_mutation
        self.strict_shutdown: bool = prepared.strict_shutdown
        self.root = root
        self._report_section = report_section
        self.outcome: Optional[ResumeOutcome] = None
        self.records: list[dict[str, Any]] = []
        """One JSON-able record per run() call, for --resume-equiv-report."""
        self.shared_root = shared_root
        self.owner = owner
        self.running = False
        """True while launches run: an interrupted test keeps its run directories."""
        self.progress: Optional[Callable[[str], None]] = None
        """Receives a line per launch event (pytest -v)."""
        self.wall = 0.0
        """Seconds spent in run() calls."""
        self.lease_dir: Optional[str] = None
        """Where device lease locks live (None: shared by every pytest on this machine)."""
        self.shared: list[str] = []
        """Shared baseline directories this test used (kept with the test on a failure)."""

    def _parallel(self) -> tuple[int, int]:
        """(launches that run at once, launches started ahead at their gate).

        On CPU a launch gets a core per rank; on accelerators `nproc` devices, leased per
        launch, so a prestarted launch needs devices to spare.
        """
        if self.device.kind == "cpu":
            return max(1, (os.cpu_count() or 1) // self.spec.world_size), 1
        fit = max(1, self.device.count // self.spec.nproc)
        return fit, 1 if self.device.count >= (fit + 1) * self.spec.nproc else 0

    def _starter(self) -> Starter:
        """Start launches with their own device lease, sharing baselines across tests."""
        waiting: dict[str, float] = {}

        def start_one(planned: PlannedLaunch, gated: bool) -> Optional[Handle]:
            spec = planned.spec
            if self.device.kind == "cpu":
                return RunningLaunch(spec, gated=gated)
            ids = visible_ids(self.device.kind, self.device.count)
            lease = DeviceLease(self.device.kind, ids, self.lease_dir)
            if not lease.try_acquire(spec.nproc):
                first = waiting.setdefault(spec.name, time.monotonic())
                if time.monotonic() - first > self.timeout.value:
                    raise ResumeEquivError(
                        f"could not lease {spec.nproc} {self.device.kind} devices for "
                        f"{spec.name} within {self.timeout.value:g}s (other pytest workers hold them)"
                    )
                return None
            try:
                running = RunningLaunch(
                    dataclasses.replace(spec, env={**spec.env, **lease.env()}), gated=gated
                )
            except BaseException:
                lease.release()
                raise
            return LeasedLaunch(running, lease)

        def start(planned: PlannedLaunch, gated: bool) -> Optional[Handle]:
            if planned.shared:
                return SharedBaseline(
                    planned.spec.run_dir, lambda: start_one(planned, False), self.owner
                )
            return start_one(planned, gated)

        return start

    @property
    def steps(self) -> int:
        return self.spec.steps

    @property
    def splits(self) -> tuple[int, ...]:
        return self.spec.splits

    @property
    def nproc(self) -> int:
        return self.spec.nproc

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def run(
        self,
        command: Command,
        *,
        checkpoint: str = DEFAULT_CHECKPOINT,
        resume_args: Sequence[str] = (),
        env: Optional[dict[str, str]] = None,
        seed: int = DEFAULT_SEED,
        cwd: Optional[str] = None,
    ) -> ResumeOutcome:
        """Launch uninterrupted and resumed runs, compare every rank; fail the test on a difference.

        `command` is an argv list (a script path or `["-m", "module", ...]`, placeholders
        allowed) or a module-level `train(ctx)` function.
        """
        __tracebackhide__ = True
        if env is not None and not (
            isinstance(env, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            _fail(f"resume_equiv.run(env=...) must be a dict of str to str, got {env!r}")
        try:
            plan = build_plan(
                PlanInputs(
                    spec=self.spec,
                    root=self.root.path,
                    device_kind=self.device.kind,
                    backend=self.device.backend,
                    timeout=self.timeout.value,
                    env={**dict(self.spec.env), **(env or {})},
                    seed=seed,
                    cwd=cwd,
                    rng_mutation=self.rng_mutation,
                    shared_root=self.shared_root,
                ),
                command,
                checkpoint=checkpoint,
                resume_args=resume_args,
            )
        except ResumeEquivError as exc:
            plan, problem = None, f"resume_equiv.run(): {exc}"
        if plan is None:
            _fail(problem)  # outside the except block: no chained exception in the report
        began = time.monotonic()
        try:
            outcome, problem = self._execute(plan)
        finally:
            self.wall += time.monotonic() - began
        if outcome is None:
            _fail(problem)
        return outcome

    def _execute(self, plan: ResumePlan) -> tuple[Optional[ResumeOutcome], str]:
        """Run the plan: (the outcome, "") when it passed, else (None, the failure text)."""
        self.shared.extend(p.spec.run_dir for p in plan.baselines if p.shared)
        self.shared.extend(p.spec.run_dir for p in plan.controls.values() if p.shared)
        partial = ResumeOutcome(plan)
        self.records.append({"plan": [p.spec.name for p in plan.launches]})
        parallel, prefetch = self._parallel()
        self.running = True
        try:
            with terminate_as_interrupt():
                outcome = execute(
                    plan,
                    self.spec,
                    start=self._starter(),
                    on_launch=partial.launches.append,
                    parallel=parallel,
                    prefetch=prefetch,
                    on_progress=self.progress,
                )
        except LaunchFailed as exc:
            self.running = False
            self.records[-1].update(
                outcome_json(partial), error=f"the {exc.result.spec.name} launch failed"
            )
            self._report_section(format_plan_summary(partial))
            role = ROLES.get(exc.role, exc.role)
            failure = format_launch_failure(exc.result, role)
            if exc.note:
                failure += f"\n  likely cause: {exc.note}"
            return None, f"{failure}\n  ({self.root.kept_text()})"
        except ResumeEquivError as exc:
            self.running = False
            self.records[-1].update(outcome_json(partial), error=str(exc))
            self._report_section(format_plan_summary(partial))
            return None, f"{exc}\n  (run directories in {self.root.path}, {self.root.kept_text()})"
        self.running = False
        self.outcome = outcome
        self.records[-1].update(outcome_json(outcome))
        self._report_section(format_plan_summary(outcome))
        if not outcome.equal:
            text = format_outcome(outcome, self.root.kept_text())
            plots = self._plots(outcome)
            self.records[-1]["plots"] = plots
            return None, text + "".join(f"\nplot: {path}" for path in plots)
        failure = _shutdown_deaths(outcome.launches, self.strict_shutdown, stacklevel=3)
        return (None, failure) if failure else (outcome, "")

    def _plots(self, outcome: ResumeOutcome) -> list[str]:
        """A PNG per diverged split (matplotlib installed, run directories kept)."""
        if self.root.keep == "none":
            return []
        paths = []
        for verdict in outcome.verdicts:
            if verdict.comparison.equal:
                continue
            div = verdict.comparison.divergence
            rank = div.rank if div is not None else 0
            path = os.path.join(self.root.path, f"plot-split{verdict.split}.png")
            base, res = verdict.baseline_signatures, verdict.signatures
            if plot_split(base, res, verdict.split, rank, path):
                paths.append(path)
        return paths


class Torchrun:
    """Returned by the `torchrun` fixture: launch a script, `-m module` or function."""

    def __init__(
        self,
        device_for: Callable[[int], Device],
        timeout: Resolved,
        root: RunRoot,
        strict_shutdown: bool = False,
    ) -> None:
        self._device_for = device_for
        self.timeout = timeout
        self.root = root
        self.strict_shutdown = strict_shutdown
        self._count = 0

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
            target = (
                target_from_callable(command)
                if callable(command)
                else target_from_argv(argv_list(command, "command"))
            )
        except ResumeEquivError as exc:
            _fail(f"torchrun(): {exc}")
        device = self._device_for(nproc)
        self._count += 1
        run_dir = os.path.join(self.root.path, f"launch-{self._count}")
        spec = LaunchSpec(
            name=f"launch-{self._count}",
            target=target,
            run_dir=run_dir,
            nproc=nproc,
            nnodes=nnodes,
            timeout=float(timeout or self.timeout.value),
            context=run_context("launch", run_dir, device.kind, device.backend, DEFAULT_SEED),
            env=dict(env or {}),
            cwd=cwd,
        )
        lease = _lease(device, nproc, spec.timeout)
        if lease is not None:
            spec.env.update(lease.env())
        try:
            result = launch(spec)
        finally:
            if lease is not None:
                lease.release()
        if check and not result.ok:
            _fail(format_launch_failure(result, "torchrun"))
        failure = _shutdown_deaths([result], self.strict_shutdown and check, stacklevel=2)
        if failure:
            _fail(failure)
        return result

    @staticmethod
    def signatures(result: LaunchResult) -> dict[int, Signature]:
        return read_run(result.spec.run_dir, result.spec.world_size)
