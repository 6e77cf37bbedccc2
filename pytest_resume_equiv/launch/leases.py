"""The queue in front of a kind's device leases: first come, first served across every
pytest process of the user on this host.

Without it a launch that needs 4 devices can wait forever behind launches that need 2: each
time 2 are released, a 2-device launch that asked later takes them again. Here every waiter
holds a ticket, numbered in arrival order, and may take devices only when no older waiter
still waits. A ticket is a file its waiter holds an flock on: a waiter that died (SIGKILL)
loses the lock with its process, and the next waiter to look removes its ticket. A waiter
that stopped asking (its test failed elsewhere, and the ticket's object is not yet collected)
stops touching its ticket and is passed over after `TICKET_FRESH` seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import Optional

TICKET_FRESH = 10.0
"""Seconds after its waiter's last ask that a ticket still holds its place."""


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class Ticket:
    """One waiter's place in the queue of `kind`'s devices under `lock_dir`."""

    def __init__(self, lock_dir: str, kind: str) -> None:
        self.dir = os.path.join(lock_dir, f"{kind}-queue")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self._guard = os.path.join(self.dir, "queue.lock")
        self._fd: Optional[int] = None
        with _exclusive(self._guard):
            number = self._next_number()
            self.path = os.path.join(self.dir, f"{number:012d}-{os.getpid()}.ticket")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fd = fd

    def _next_number(self) -> int:
        counter = os.path.join(self.dir, "counter")
        try:
            with open(counter, encoding="ascii") as f:
                number = int(f.read().strip() or 0)
        except (OSError, ValueError):
            number = 0
        with open(counter, "w", encoding="ascii") as f:
            f.write(str(number + 1))
        return number

    @property
    def held(self) -> bool:
        return self._fd is not None

    def first(self) -> bool:
        """Whether no older waiter still waits (so this one may take devices now). Asking
        keeps this ticket's place; the tickets of dead waiters are removed."""
        if self._fd is None:
            raise RuntimeError("the ticket was returned")
        os.utime(self.path)
        mine = os.path.basename(self.path)
        now = time.time()
        with _exclusive(self._guard):
            for name in sorted(os.listdir(self.dir)):
                if not name.endswith(".ticket") or name >= mine:
                    continue
                path = os.path.join(self.dir, name)
                if _abandoned(path):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
                    continue
                try:
                    if now - os.path.getmtime(path) <= TICKET_FRESH:
                        return False
                except FileNotFoundError:
                    continue
        return True

    def leave(self) -> None:
        """Give the place up (the devices were leased, or the wait ended)."""
        if self._fd is None:
            return
        # without the queue's lock: this also runs from __del__, maybe while this very
        # process holds that lock in first(); a scanner copes with a ticket that vanishes
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.leave()


def _abandoned(path: str) -> bool:
    """The waiter that holds this ticket has exited (nobody holds its lock)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
