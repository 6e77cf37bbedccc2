"""The objects behind the `resume_equiv` and `torchrun` fixtures."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import pytest

from .devices import Device, DeviceLease, visible_ids
from .launch import LaunchResult, LaunchSpec, launch
from .orchestrate import (
    DEFAULT_CHECKPOINT,
    LaunchFailed,
    PlanInputs,
    ResumeEquivError,
    ResumeOutcome,
    argv_list,
    build_plan,
    execute,
    run_context,
    target_from_argv,
    target_from_callable,
)
from .report import format_launch_failure, format_outcome, format_plan_summary, outcome_json
from .settings import MarkerSpec, Resolved
from .signature import Signature, read_run

Command = Union[Sequence[str], Callable[..., Any]]
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


def _fail(message: str) -> None:
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


class ResumeEquiv:
    """Returned by the `resume_equiv` fixture: `run(...)` the trainer and compare the runs."""

    def __init__(self, prepared: Any, root: RunRoot, report_section: Callable[[str], None]) -> None:
        self.spec: MarkerSpec = prepared.spec
        self.device: Device = prepared.device
        self.timeout: Resolved = prepared.timeout
        self.rng_mutation: bool = prepared.rng_mutation
        self.root = root
        self._report_section = report_section
        self.outcome: Optional[ResumeOutcome] = None
        self.records: list[dict[str, Any]] = []
        """One JSON-able record per run() call, for --resume-equiv-report."""

    def _parallel(self) -> int:
        """Launches that fit side by side: CPU cores per rank on CPU; one on accelerators
        (their devices are leased for the whole test)."""
        if self.device.kind != "cpu":
            return 1
        return max(1, (os.cpu_count() or 1) // self.spec.world_size)

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
                ),
                command,
                checkpoint=checkpoint,
                resume_args=resume_args,
            )
        except ResumeEquivError as exc:
            _fail(f"resume_equiv.run(): {exc}")
        lease = _lease(self.device, self.spec.nproc, self.timeout.value)
        if lease is not None:
            for planned in plan.launches:
                planned.spec.env.update(lease.env())
        partial = ResumeOutcome(plan)
        self.records.append({"plan": [p.spec.name for p in plan.launches]})
        try:
            outcome = execute(
                plan, self.spec, on_launch=partial.launches.append, parallel=self._parallel()
            )
        except LaunchFailed as exc:
            self.records[-1].update(
                outcome_json(partial), error=f"the {exc.result.spec.name} launch failed"
            )
            role = "uninterrupted" if exc.result.spec.name.startswith("baseline") else "resumed"
            self._report_section(format_plan_summary(partial))
            _fail(f"{format_launch_failure(exc.result, role)}\n  ({self.root.kept_text()})")
        except ResumeEquivError as exc:
            self.records[-1].update(outcome_json(partial), error=str(exc))
            self._report_section(format_plan_summary(partial))
            _fail(f"{exc}\n  (run directories in {self.root.path}, {self.root.kept_text()})")
        finally:
            if lease is not None:
                lease.release()
        self.outcome = outcome
        self.records[-1].update(outcome_json(outcome))
        self._report_section(format_plan_summary(outcome))
        if not outcome.equal:
            _fail(format_outcome(outcome, self.root.kept_text()))
        return outcome


class Torchrun:
    """Returned by the `torchrun` fixture: launch a script, `-m module` or function."""

    def __init__(
        self, device_for: Callable[[int], Device], timeout: Resolved, root: RunRoot
    ) -> None:
        self._device_for = device_for
        self.timeout = timeout
        self.root = root
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
        return result

    @staticmethod
    def signatures(result: LaunchResult) -> dict[int, Signature]:
        return read_run(result.spec.run_dir, result.spec.world_size)
