"""Waiting on launches without sleep-polling (launch/waiting.py, the scheduler's wait): an
exit wakes the waiter, a deadline still ends the wait, a process the waiter did not start
(as a forked rank is the fork server's child) wakes it too, and nothing is left running.
No wall-clock assertion: only what ended each wait."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv.launch import waiting
from pytest_resume_equiv.launch.waiting import ExitFds, Wake, pidfd, wait, wait_exits
from pytest_resume_equiv.schedule import Scheduler

needs_pidfd = pytest.mark.skipif(
    pidfd(os.getpid()) is None, reason="no pidfd_open here (the waits fall back to polling)"
)


def train(ctx):
    """Stands in for a trainer: nothing runs it."""


WAITS_FOR_STDIN = [sys.executable, "-c", "import sys; sys.stdin.read()"]


def started(argv=WAITS_FOR_STDIN):
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


@needs_pidfd
def test_a_wait_ends_when_the_child_exits_and_not_before():
    proc = started()
    fds = ExitFds()
    try:
        fds.watch([proc])
        assert proc.poll() is None
        wake = fds.wake([proc], [True])
        assert len(wake.fds) == 1
        assert wait(Wake(list(wake.fds), at=time.monotonic() + 0.05)) is False  # deadline
        proc.stdin.close()  # it reads EOF and exits
        assert wait(Wake(list(wake.fds), at=time.monotonic() + 60)) is True
        assert proc.poll() == 0
        assert fds.wake([proc], [False]).fds == []  # closed once seen to exit: no busy loop
    finally:
        fds.close()
        stop(proc)


GRANDCHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
sys.stdin.readline()  # reap only when asked, as the fork server does
print(child.wait(), flush=True)
"""


@needs_pidfd
def test_a_process_of_another_parent_wakes_the_waiter_when_it_exits():
    """A forked rank is the fork server's child, not pytest's: its pidfd still wakes."""
    middle = started([sys.executable, "-c", GRANDCHILD])
    fd = None
    try:
        pid = int(middle.stdout.readline())
        fd = pidfd(pid)
        assert fd is not None
        assert wait(Wake([fd], at=time.monotonic() + 0.05)) is False
        os.kill(pid, 9)
        assert wait(Wake([fd], at=time.monotonic() + 60)) is True
        middle.stdin.write(b"reap\n")
        middle.stdin.flush()
        assert int(middle.stdout.readline()) == -9
    finally:
        if fd is not None:
            os.close(fd)
        stop(middle)


def test_wait_exits_waits_for_every_process_and_gives_up_at_its_timeout():
    procs = [started(), started()]
    try:
        assert wait_exits(procs, timeout=0.05) is False  # both still run
        for proc in procs:
            proc.kill()
        assert wait_exits(procs, timeout=60) is True
        assert all(p.returncode == -9 for p in procs)
    finally:
        for proc in procs:
            stop(proc)


def test_without_pidfd_open_the_waits_poll_and_still_see_the_exit(monkeypatch):
    monkeypatch.delattr(waiting.os, "pidfd_open", raising=False)
    proc = started()
    fds = ExitFds()
    try:
        fds.watch([proc])
        wake = fds.wake([proc], [True])
        assert wake.fds == [] and wake.at < time.monotonic() + 1  # a bounded look, no fd
        proc.kill()
        assert wait_exits([proc], timeout=60) is True
    finally:
        fds.close()
        stop(proc)


class PipeHandle:
    """A fake launch that ends when a byte arrives on its pipe; counts its polls."""

    gate_open = True

    def __init__(self, result):
        self.read, self.write = os.pipe()
        os.set_blocking(self.read, False)
        self.result, self.polls, self.killed = result, 0, False

    def open_gate(self):
        pass

    def poll(self):
        self.polls += 1
        try:
            return self.result if os.read(self.read, 1) else None
        except BlockingIOError:
            return None

    def wake(self):
        return Wake([self.read])

    def kill(self):
        self.killed = True

    def close(self):
        os.close(self.read)
        os.close(self.write)


def test_the_scheduler_blocks_until_a_launch_wakes_it_instead_of_spinning(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1)
    planned = plan.launches[0]
    handle = PipeHandle(result=SimpleNamespace(status="ok", note=""))
    scheduler = Scheduler(lambda p, gated: handle, poll_interval=0.01)
    scheduler.add(planned)
    done = []
    timer = threading.Timer(0.3, os.write, (handle.write, b"x"))
    timer.start()
    try:
        scheduler.run(lambda job, result: done.append(result))
    finally:
        timer.cancel()
        handle.close()
    assert done == [handle.result]
    assert handle.polls <= 3  # one look, the wait, the look that finds it (no 20 ms loop)


def test_the_scheduler_wakes_at_a_launchs_deadline_with_nothing_to_read(tmp_path):
    """A launch that never exits still ends the wait at its deadline (its timeout)."""

    _, plan = plan_for(tmp_path, train, nproc=1)
    deadline = time.monotonic() + 0.2
    ENDED = SimpleNamespace(status="timed out", note="")

    class TimingOut:
        gate_open = True
        polls = 0

        def open_gate(self):
            pass

        def poll(self):
            self.polls += 1
            return ENDED if time.monotonic() >= deadline else None

        def wake(self):
            return Wake(at=deadline)

        def kill(self):
            pass

    handle = TimingOut()
    scheduler = Scheduler(lambda p, gated: handle, poll_interval=0.01)
    scheduler.add(plan.launches[0])
    done = []
    scheduler.run(lambda job, result: done.append(result))
    assert done == [ENDED] and handle.polls <= 3
