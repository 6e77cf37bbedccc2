"""Waiting for launches without sleep-polling: a process's exit wakes the waiter.

A started process (a torchrun agent that pytest started, or a rank the fork server forked:
not pytest's child) gets a pidfd (`os.pidfd_open`, Linux 5.3 and Python 3.9 on), which
becomes readable the moment the process exits; the scheduler and `RunningLaunch.wait` block
in `select` on the pidfds of what they wait for, with the next deadline (a launch's timeout,
a failed rank's grace period, the next progress line) as its timeout. Where there is no
pidfd (another OS, an older kernel) or something cannot be waited on (a shared launch that
another pytest-xdist worker runs, a device lease, the signature files of an
interrupt="kill" launch), the wait is bounded by `POLL`: the old polling, only there.

A pidfd of a process that pytest did not start names that process only while it has not
been reaped: open it, then ask whether the process has exited (`ExitFds.watch`'s rule);
the fork server reaps a rank only when pytest asks it.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

POLL = 0.02
"""Seconds between two looks at what cannot wake a waiter (see the module's docstring)."""


def pidfd(pid: int) -> Optional[int]:
    """A file descriptor readable once `pid` has exited; None without `pidfd_open`, or when
    the process is gone (its exit status is read without waiting)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:  # ESRCH (gone), ENOSYS (kernel before 5.3), EMFILE
        return None


@dataclass
class Wake:
    """What wakes a waiter: any of `fds` readable, or the monotonic time `at`."""

    fds: list[int] = field(default_factory=list)
    at: float = math.inf

    def add(self, other: Wake) -> Wake:
        self.fds += other.fds
        self.at = min(self.at, other.at)
        return self

    def by(self, at: float) -> Wake:
        """Wake at `at` at the latest."""
        self.at = min(self.at, at)
        return self

    def soon(self) -> Wake:
        """Something here can only be polled: look again after POLL seconds."""
        return self.by(time.monotonic() + POLL)


def wait(wake: Wake) -> bool:
    """Block until one of `wake.fds` is readable or `wake.at` has come; True if an fd woke
    it. With nothing to wait for and no deadline, it returns after POLL seconds (a caller
    that forgot to say what it waits for polls slowly instead of hanging)."""
    if not wake.fds and wake.at == math.inf:
        wake = Wake(at=time.monotonic() + POLL)
    timeout = max(0.0, wake.at - time.monotonic()) if wake.at != math.inf else None
    if not wake.fds:
        time.sleep(timeout or 0.0)
        return False
    poller = select.poll() if hasattr(select, "poll") else None
    if poller is None:  # no poll(2): select(2), enough for the few fds of a test's launches
        ready, _, _ = select.select(wake.fds, [], [], timeout)
        return bool(ready)
    for fd in wake.fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))


class Exiting(Protocol):
    """A started process: `subprocess.Popen` or a forked rank."""

    pid: int

    def poll(self) -> Optional[int]: ...


class ExitFds:
    """The pidfds of a launch's started processes, closed once each has been seen to exit."""

    def __init__(self) -> None:
        self._fds: dict[int, Optional[int]] = {}

    def watch(self, procs: Iterable[Exiting]) -> None:
        """Open a pidfd for each process. The caller polls every process after this (as the
        scheduler and `wait_exits` do before they wait): a process found running then is
        the one the pidfd names, even one whose pid the fork server could reap and reuse."""
        for proc in procs:
            if proc.pid not in self._fds:
                self._fds[proc.pid] = pidfd(proc.pid)

    def wake(self, procs: Sequence[Exiting], running: Sequence[bool]) -> Wake:
        """What wakes a waiter for the processes still `running` (each's last poll): their
        pidfds; a process without one makes the wait a poll. Those that exited are closed
        (a readable pidfd of a finished process would wake every wait at once)."""
        wake = Wake()
        for proc, alive in zip(procs, running):
            if not alive:
                self._close(proc.pid)
                continue
            fd = self._fds.get(proc.pid)
            if fd is None:
                wake.soon()
            else:
                wake.fds.append(fd)
        return wake

    def _close(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self._close(pid)


def wait_exits(procs: Sequence[Exiting], timeout: float, fds: Optional[ExitFds] = None) -> bool:
    """Wait until every process in `procs` has exited (polled: reaped, its status kept), for
    `timeout` seconds at most; True if all did."""
    own = fds is None
    watch = ExitFds() if fds is None else fds
    watch.watch(procs)
    deadline = time.monotonic() + timeout
    try:
        while True:
            running = [p.poll() is None for p in procs]
            if not any(running):
                return True
            if time.monotonic() >= deadline:
                return False
            wait(watch.wake(procs, running).by(deadline))
    finally:
        if own:
            watch.close()
