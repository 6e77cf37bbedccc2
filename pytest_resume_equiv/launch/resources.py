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
from collections.abc import Sequence
from typing import Optional, Protocol

from ..errors import ResumeEquivError
from .devices import Device, DeviceLease, default_lock_dir, lock_names, visible_ids
from .leases import Ticket
from .running import Handle, LaunchResult, LaunchSpec, RunningLaunch
from .share import SharedLaunch
from .spec import Launcher
from .waiting import Wake


def parallelism(
    device: Device, nproc: int, world_size: int, launcher: Optional[Launcher] = None
) -> tuple[int, int]:
    """(launches that run the user's code at once, launches started ahead at their gate).

    On CPU a launch gets a core per rank, and one more launch may start ahead and wait. (As
    many as may run, the teeth check's launch prestarted beside the resumed one, was measured
    in issue 45: most of those were killed unstarted, the check skipped or cancelled once
    the uninterrupted launch was judged, and the forks cost more CPU than they saved.)
    On accelerators a launch leases the devices it uses on this host when it starts (every
    simulated node's: `nproc * nnodes`), so as many launches run as there are device sets,
    and none starts ahead: it would hold devices while it waits. Under Slurm the steps of one
    allocation all see its devices (the plugin leases none), so accelerator launches run one
    at a time.
    """
    if device.kind == "cpu":
        return max(1, (os.cpu_count() or 1) // world_size), 1
    launcher = launcher or Launcher()
    if launcher.one_accelerator_launch:
        return 1, 0
    return max(1, device.count // launcher.devices_per_host(nproc, world_size // nproc)), 0


class LeaseWait:
    """Waiting for `n` devices of `device`: ask now, or block; give up after `timeout`s.

    Waiters are served in arrival order across every pytest process (leases.py); a wait for
    more devices than this process can see fails at once, not after the timeout."""

    def __init__(
        self, device: Device, n: int, timeout: float, what: str, lock_dir: Optional[str] = None
    ) -> None:
        self.device = device
        self.n = n
        self.timeout = timeout
        self.what = what
        self.lock_dir = lock_dir or default_lock_dir()
        self.since: Optional[float] = None
        self.ticket: Optional[Ticket] = None

    def poll(self, prefer: Sequence[str] = ()) -> Optional[DeviceLease]:
        """The lease if the devices are free now and no earlier waiter still waits; None if
        not yet; ResumeEquivError when they can never be had, or once the wait has lasted
        longer than the timeout. `prefer`: ids to take first (the test's previous launch's)."""
        kind = self.device.kind
        ids = visible_ids(kind, self.device.count, rocm=self.device.rocm)
        if self.n > len(ids):
            raise ResumeEquivError(
                f"{self.what} needs {self.n} {kind} devices on this host, but this process "
                f"sees {len(ids)} ({self._visible()}): lower nproc, nnodes or resume_nproc, "
                "or make more devices visible"
            )
        if self.ticket is None:
            self.ticket = Ticket(self.lock_dir, kind)
        if self.ticket.first():
            lease = DeviceLease(
                kind,
                ids,
                self.lock_dir,
                lock_names(self.device, ids),
                self.device.visible_vars,
            )
            if lease.try_acquire(self.n, prefer):
                self.leave()
                return lease
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if now - self.since > self.timeout:
            self.leave()
            raise ResumeEquivError(
                f"could not lease {self.n} {kind} devices for {self.what} within "
                f"{self.timeout:g}s (other launches or pytest workers hold them)"
            )
        return None

    def _visible(self) -> str:
        for var in self.device.visible_vars:
            if var in os.environ:
                return f"{var}={os.environ[var]}"
        return f"{self.device.count} found"

    def leave(self) -> None:
        """Give up this wait's place in the queue."""
        if self.ticket is not None:
            self.ticket.leave()
            self.ticket = None

    def wait(self, prefer: Sequence[str] = ()) -> DeviceLease:
        try:
            while True:
                lease = self.poll(prefer)
                if lease is not None:
                    return lease
                time.sleep(0.1 + random.random() * 0.4)
        finally:
            self.leave()


def with_lease(spec: LaunchSpec, lease: Optional[DeviceLease]) -> LaunchSpec:
    """The launch restricted to its leased devices (their visible-devices variables)."""
    if lease is None:
        return spec
    return dataclasses.replace(spec, env={**spec.env, **lease.env()}, lease_env=lease.env())


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

    def wake(self) -> Wake:
        return self._running.wake()

    def kill(self) -> None:
        try:
            self._running.kill()
        finally:
            self._lease.release()


class Startable(Protocol):
    """What starting a launch needs to know of a planned one (`plan.PlannedLaunch`)."""

    spec: LaunchSpec
    shared: bool


class LeasingStarter:
    """The scheduler's starter for one test (`schedule.Starter`): leases devices per launch,
    and runs a shared uninterrupted launch once for every test that plans it."""

    def __init__(
        self, device: Device, timeout: float, owner: str, lock_dir: Optional[str] = None
    ) -> None:
        self.device = device
        self.timeout = timeout
        self.owner = owner
        """The test's node id: a reused launch says which test ran it."""
        self.lock_dir = lock_dir
        self._waits: dict[str, LeaseWait] = {}
        self.previous: list[str] = []
        """The devices this test's last leased launch had: its next launch asks for them
        first, since other GPUs (another NVLink or PCIe path) can change NCCL's reduction
        order and so the trajectory."""

    def close(self) -> None:
        """The test's launches are over: no wait of it keeps a place in the lease queue."""
        for wait in self._waits.values():
            wait.leave()

    def __call__(self, planned: Startable, gated: bool) -> Optional[Handle]:
        if planned.shared:
            return SharedLaunch(
                planned.spec.run_dir, lambda: self._start(planned, False), self.owner
            )
        return self._start(planned, gated)

    def _start(self, planned: Startable, gated: bool) -> Optional[Handle]:
        spec = planned.spec
        if self.device.kind == "cpu" or not spec.launcher.leases_devices:  # Slurm: GRES
            return RunningLaunch(spec, gated=gated)
        n = spec.launcher.devices_per_host(spec.nproc, spec.nnodes)
        wait = self._waits.setdefault(
            spec.name, LeaseWait(self.device, n, self.timeout, spec.name, self.lock_dir)
        )
        lease = wait.poll(self.previous)
        if lease is None:
            return None
        self.previous = list(lease.held)
        try:
            return LeasedLaunch(RunningLaunch(with_lease(spec, lease), gated=gated), lease)
        except BaseException:
            lease.release()
            raise
