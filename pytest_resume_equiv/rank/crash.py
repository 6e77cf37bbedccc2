"""interrupt="crash": the rank that reaches the chosen point of the save kills every rank of
its host with SIGKILL, as a preempted node dies in the middle of a checkpoint.

Both sides share what "the save" is (`in_window`: the file events between the step before
the split and the step after it) and how a point is named (the index of an event in one
rank's window), so the plugin finds the points in the uninterrupted run's events and the
crash launch's ranks count the same events. A point is either an event ("after" it happened)
or "returned": the first `record()` after the save's last event on the main thread, with
every background thread's file events in the window held, so an asynchronous save is still
in flight when the kill comes. Its index counts the main thread's events only, which the
held writes cannot shift.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Optional

from .files import Event
from .layout import crash_record_path, read_pids

AFTER_EVENT = "event"
WRITTEN = "written"
"""A file opened for writing, killed once written: at the next file call or record()."""
RETURNED = "returned"
HOLD_LIMIT = 5.0
"""Seconds a held background write waits for the main thread's next `record()`."""


def in_window(event: Event, split: int, splits: tuple[int, ...]) -> bool:
    """Whether `event` belongs to the save at `split`: after step split-1 was recorded (unless
    that step saved too) and before step split+1 was."""
    after = event.get("after_step")
    after = 0 if after is None else after
    earliest = split if (split - 1) in splits else split - 1
    return earliest <= after <= split


def relative(path: str, run_dir: str) -> str:
    """`path` as the report shows it: relative to the run directory when inside it."""
    root = os.path.realpath(run_dir)
    real = os.path.realpath(path)
    return os.path.relpath(real, root) if real.startswith(root + os.sep) else real


def describe(event: Event, run_dir: str) -> str:
    """`os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)`."""
    where = relative(str(event.get("path", "")), run_dir)
    if event.get("to"):
        where += f" -> {relative(str(event['to']), run_dir)}"
    thread = f" in thread {event['thread']}" if event.get("thread") else ""
    return f"{event.get('op', '?')}({where}){thread}"


class Crasher:
    """One rank's side of a crash launch: counts its window's events and kills at the point.
    `point`: {"rank", "index", "kind", "split"} from the launch context."""

    def __init__(self, point: dict[str, Any], rank: int, splits: tuple[int, ...], run_dir: str):
        self.point = point
        self.rank = rank
        self.splits = splits
        self.run_dir = run_dir
        self.seen = 0
        self.armed = False
        """kind "returned": the save's last main-thread event has happened."""
        self.written: Optional[Event] = None
        """kind "written": the file opened at the point, now being written."""
        self.started = False
        """The save at the split has had a main-thread event on this rank."""
        self._lock = threading.Lock()

    @property
    def mine(self) -> bool:
        return int(self.point["rank"]) == self.rank

    def on_event(self, event: Event) -> None:
        """A file event was logged (and written to the signature)."""
        if not in_window(event, int(self.point["split"]), self.splits):
            return
        background = threading.current_thread() is not threading.main_thread()
        returned = self.point["kind"] == RETURNED
        if returned and background:
            if self.saving(event):
                self.hold()  # the save gets no further: still in flight at the kill
            return
        self.started = True
        if not self.mine:
            return
        with self._lock:
            index, self.seen = self.seen, self.seen + 1
        if index != int(self.point["index"]):
            return
        if self.point["kind"] == WRITTEN:
            self.written = event
        elif not returned:
            self.kill(f"after {describe(event, self.run_dir)}", event)
        else:
            self.armed = True

    def before_call(self) -> None:
        """A file call starts: a file opened for writing at the point has been written."""
        if self.written is not None and threading.current_thread() is threading.main_thread():
            where = relative(str(self.written.get("path", "")), self.run_dir)
            self.kill(f"after writing {where} (closed, before the next file call)", self.written)

    def on_record(self, step: int) -> None:
        """`record(step)` was called: past the save, once it has returned."""
        if self.written is not None:
            self.before_call()
        if self.armed and self.mine:
            self.kill(f"after the save returned, at record(step={step})", None)

    def saving(self, event: Event) -> bool:
        """Whether a background write belongs to the save at the split, not to an earlier
        one still finishing: it came after the split's step, or after this save's first
        main-thread event."""
        return (event.get("after_step") or 0) >= int(self.point["split"]) or self.started

    def hold(self) -> None:
        """Hold a background write of the save until the kill. If the training waits for it
        instead of going on to its next `record()`, the save has returned all the same: kill
        then; if it waits before the save returned, this was not the save's write: let go."""
        deadline = time.monotonic() + HOLD_LIMIT
        while time.monotonic() < deadline and not self.armed:
            time.sleep(0.02)
        if self.armed and self.mine:
            time.sleep(HOLD_LIMIT)  # give the training its chance to go on to record()
            self.kill("after the save returned, while the training waited for its write", None)
        if self.armed:
            _hold()  # the point's rank kills this one, or has already
        if not self.mine:  # another rank's write: until the point's rank kills this one,
            time.sleep(4 * HOLD_LIMIT)  # unless that waits for it (a collective): let go

    def kill(self, where: str, event: Optional[Event]) -> None:
        """Say where, then SIGKILL every rank of this host (this one last)."""
        self.written = None  # its own record is no file of the save
        record = {"rank": self.rank, "where": where, "event": event, "time_ns": time.time_ns()}
        path = crash_record_path(self.run_dir)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        me = os.getpid()
        for pid in read_pids(self.run_dir).values():
            if pid != me:
                _kill(pid)
        _kill(me)


def _kill(pid: int) -> None:
    for send in (os.killpg, os.kill):
        try:
            send(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _hold() -> None:
    while True:
        time.sleep(3600)
