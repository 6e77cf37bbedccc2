"""What a launch may use: how many launches fit the machine at once, and the devices each
one leases (so pytest-xdist workers and side-by-side launches never share an accelerator).

One wait policy for devices: `LeaseWait.poll` asks without blocking (the scheduler asks again
next turn) and `LeaseWait.wait` blocks on the same policy (the `torchrun` fixture); both give
up with one message after the timeout.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from typing import Optional

from ..errors import ResumeEquivError
from ..plan import PlannedLaunch
from ..schedule import Handle
from .agents import LauncherKind, launcher_of
from .devices import Device, DeviceLease, visible_ids
from .running import LaunchResult, LaunchSpec, RunningLaunch
from .share import SharedLaunch


def parallelism(
    device: Device, nproc: int, world_size: int, launcher: Optional[LauncherKind] = None
) -> tuple[int, int]:
    """(launches that run the user's code at once, launches started ahead at their gate).

    On CPU a launch gets a core per rank, and one more launch may start ahead and wait.
    On accelerators a launch leases `nproc` devices when it starts, so as many launches run
    as there are device sets, and none starts ahead: it would hold devices while it waits.
    Under Slurm the steps of one allocation all see its devices (the plugin leases none), so
    accelerator launches run one at a time.
    """
    if device.kind == "cpu":
        return max(1, (os.cpu_count() or 1) // world_size), 1
    if launcher is not None and launcher.one_accelerator_launch:
        return 1, 0
    return max(1, device.count // nproc), 0


class LeaseWait:
    """Waiting for `n` devices of `device`: ask now, or block; give up after `timeout`s."""

    def __init__(
        self, device: Device, n: int, timeout: float, what: str, lock_dir: Optional[str] = None
    ) -> None:
        self.device = device
        self.n = n
        self.timeout = timeout
        self.what = what
        self.lock_dir = lock_dir
        self.since: Optional[float] = None

    def poll(self) -> Optional[DeviceLease]:
        """The lease if the devices are free now; None if not yet; ResumeEquivError once the
        wait has lasted longer than the timeout."""
        lease = DeviceLease(
            self.device.kind, visible_ids(self.device.kind, self.device.count), self.lock_dir
        )
        if lease.try_acquire(self.n):
            return lease
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if now - self.since > self.timeout:
            raise ResumeEquivError(
                f"could not lease {self.n} {self.device.kind} devices for {self.what} within "
                f"{self.timeout:g}s (other pytest workers hold them)"
            )
        return None

    def wait(self) -> DeviceLease:
        while True:
            lease = self.poll()
            if lease is not None:
                return lease
            time.sleep(0.1 + random.random() * 0.4)


def with_lease(spec: LaunchSpec, lease: Optional[DeviceLease]) -> LaunchSpec:
    """The launch restricted to its leased devices (their visible-devices variable)."""
    if lease is None:
        return spec
    return dataclasses.replace(spec, env={**spec.env, **lease.env()})


class LeasedLaunch:
    """A launch holding its devices until it ends."""

    def __init__(self, running: RunningLaunch, lease: DeviceLease) -> None:
        self._running = running
        self._lease = lease

    @property
    def gate_open(self) -> bool:
        return self._running.gate_open

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


class Launcher:
    """The scheduler's starter for one test: leases devices per launch, and runs a shared
    uninterrupted launch once for every test that plans it."""

    def __init__(
        self, device: Device, timeout: float, owner: str, lock_dir: Optional[str] = None
    ) -> None:
        self.device = device
        self.timeout = timeout
        self.owner = owner
        """The test's node id: a reused launch says which test ran it."""
        self.lock_dir = lock_dir
        self._waits: dict[str, LeaseWait] = {}

    def __call__(self, planned: PlannedLaunch, gated: bool) -> Optional[Handle]:
        if planned.shared:
            return SharedLaunch(
                planned.spec.run_dir, lambda: self._start(planned, False), self.owner
            )
        return self._start(planned, gated)

    def _start(self, planned: PlannedLaunch, gated: bool) -> Optional[Handle]:
        spec = planned.spec
        if self.device.kind == "cpu" or not launcher_of(spec).leases_devices:  # Slurm: GRES
            return RunningLaunch(spec, gated=gated)
        wait = self._waits.setdefault(
            spec.name, LeaseWait(self.device, spec.nproc, self.timeout, spec.name, self.lock_dir)
        )
        lease = wait.poll()
        if lease is None:
            return None
        try:
            return LeasedLaunch(RunningLaunch(with_lease(spec, lease), gated=gated), lease)
        except BaseException:
            lease.release()
            raise
