"""interrupt="crash": the rank that reaches the chosen point of the save kills every rank of
its host with SIGKILL, as a preempted node dies in the middle of a checkpoint.

Both sides share what "the save" is (`SaveWindow`) and how a point is named (the index of an
event among the window's events of its kind of thread, main or background, on one rank), so
the plugin finds the points in the uninterrupted run's events and the crash launch's ranks
count the same events; counting the two kinds apart keeps the index whatever order a writer
thread's events interleave with the main thread's in. A point is either an event ("after" it
happened) or "returned": the first `record()` after the save's last event on the main thread,
with every background write of the save held, so an asynchronous save is still in flight
when the kill comes; or "torn", inside a write: the file the event writes (a `torch.save`, a
safetensors save, an `open` for writing, DCP's per-rank files among them) is cut to half its
size once written, then the kill, as if it came halfway through the write.

crash_mode="preempt" (a point context with `preempt`: the grace in seconds) sends SIGTERM
instead of SIGKILL, at the same points and at one more, "step": inside the step after the
split, right before its optimizer step (after its backward), or at the start of its optimizer
step when that is given a closure (LBFGS, Lightning: the closure runs the step's forward and
backward inside it), or at its `record()` when no optimizer step comes first. Which step an
optimizer step belongs to is the last step recorded plus one, plus one more when the same
optimizer has stepped since that record (automatic recording writes a step at the next
step's first forward, which a closure runs inside the optimizer step). A watchdog process
(`grace.py`) SIGKILLs what still runs once the grace is over.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Optional

from . import grace
from .auto import _initialising_state
from .files import Event
from .run_dir import crash_record_path, read_pids

AFTER_EVENT = "event"
WRITTEN = "written"
"""A file opened for writing, killed once written: at the next file call or record()."""
RETURNED = "returned"
TORN = "torn"
"""A file being written: once written (at the writer thread's next file call, or its next
`record()`), cut to half its size, then the kill."""
STEP = "step"
"""crash_mode="preempt": inside the step after the split, before its optimizer step."""
TORN_OPS = ("open", "torch.save", "safetensors.torch.save_file")
"""The events that write one file, which a torn point cuts."""
HOLD_LIMIT = 5.0
"""Seconds a held background write waits for the main thread's next `record()`."""


def in_window(event: Event, split: int, splits: tuple[int, ...]) -> bool:
    """Whether `event` belongs to the save at `split`: after step split-1 was recorded (unless
    that step saved too) and before step split+1 was."""
    return earliest_step(split, splits) <= _after(event) <= split


def earliest_step(split: int, splits: tuple[int, ...]) -> int:
    """The first `after_step` an event of the save at `split` may have."""
    return split if (split - 1) in splits else split - 1


def _after(event: Event) -> int:
    after = event.get("after_step")
    return 0 if after is None else int(after)


class SaveWindow:
    """Which of one rank's file events, taken in the order they were logged, belong to the
    save at `split`.

    The main thread's: those between the step before the split and the step after it
    (`in_window`). A background thread's, once the save's first main-thread event was logged:
    every one up to the next split's save, however many steps the writer lags behind (DCP's
    `async_save` finishes steps later). Before it (or in a save with no main-thread event at
    all), from the step before the split on, unless the write goes into a folder that only
    the save before wrote into from a thread (`foreign`, found in the uninterrupted run): the
    tail of that save, which DCP's thread finishes during the next steps, is not this one's,
    while a thread this save started before its first main-thread file call is. Folders are
    named relative to the run directory (`run_dir`), so the uninterrupted run's apply to a
    crash launch's."""

    def __init__(
        self,
        split: int,
        splits: tuple[int, ...],
        run_dir: str,
        foreign: tuple[str, ...] = (),
        before_start: bool = True,
    ):
        self.split = split
        self.run_dir = run_dir
        self.splits = splits
        self.foreign = frozenset(foreign)
        self.before_start = before_start
        """Whether background writes before the save's first main-thread event may count."""
        later = [s for s in splits if s > split]
        self.end = earliest_step(min(later), splits) if later else None
        self.started = False
        """The save's first main-thread event has been logged."""
        self.ended = False
        """The next split's save has begun on the main thread."""

    def admit(self, event: Event) -> bool:
        if not event.get("thread"):
            if in_window(event, self.split, self.splits):
                self.started = True
                return True
            if self.started and self.end is not None:
                self.ended = self.ended or _after(event) >= self.end
            return False
        if self.started:
            return not self.ended
        after = _after(event)
        return (
            self.before_start
            and earliest_step(self.split, self.splits) <= after
            and (self.end is None or after < self.end)
            and relative(os.path.dirname(str(event.get("path", ""))), self.run_dir)
            not in self.foreign
        )


def save_events(
    events: list[Event], split: int, splits: tuple[int, ...], run_dir: str
) -> list[Event]:
    """The events of one rank's whole log (in its order, written in `run_dir`) that belong
    to the save at `split`."""
    window = SaveWindow(split, splits, run_dir, foreign_folders(events, split, splits, run_dir))
    return [e for e in events if window.admit(e)]


def foreign_folders(
    events: list[Event], split: int, splits: tuple[int, ...], run_dir: str
) -> tuple[str, ...]:
    """The folders the save before `split` wrote into from a thread and this save does not
    write into once begun: a background write there, before this save began, is that one's."""
    earlier = [s for s in splits if s < split]
    if not earlier:
        return ()
    before = [e for e in save_events(events, max(earlier), splits, run_dir) if e.get("thread")]
    begun = SaveWindow(split, splits, run_dir, before_start=False)
    mine = {folder for e in events if begun.admit(e) for folder in _folders(e)}
    theirs = {os.path.dirname(str(e.get("path", ""))) for e in before}
    return tuple(sorted(relative(f, run_dir) for f in theirs - mine))


def _folders(event: Event) -> set[str]:
    paths = [str(event[key]) for key in ("path", "to") if event.get(key)]
    return {*paths, *(os.path.dirname(p) for p in paths)}


def thread_kind(event: Event) -> str:
    """How a point names the thread an event was logged on: "main" or "background"."""
    return "background" if event.get("thread") else "main"


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
    `point`: {"rank", "index", "thread", "kind", "split", "foreign"} from the launch
    context ("thread" and "foreign" default to "main" and none)."""

    def __init__(self, point: dict[str, Any], rank: int, splits: tuple[int, ...], run_dir: str):
        self.point = point
        self.rank = rank
        self.run_dir = run_dir
        foreign = tuple(point.get("foreign", ()))
        self.window = SaveWindow(int(point["split"]), splits, run_dir, foreign)
        self.seen = {"main": 0, "background": 0}
        self.armed = False
        """kind "returned": the save's last main-thread event has happened."""
        self.written: Optional[Event] = None
        """kind "written": the file opened at the point, now being written."""
        self.torn: Optional[tuple[Event, threading.Thread]] = None
        """kind "torn": the file opened at the point, and the thread writing it."""
        self._lock = threading.Lock()
        self.fired = False
        """The point was reached (preempt: the SIGTERM was sent, the ranks run on)."""
        self.last_step: Optional[int] = None
        """The last step `record()`ed."""
        self.stepped: set[int] = set()
        """ids of the optimizers that stepped since the last `record()`."""

    @property
    def mine(self) -> bool:
        return int(self.point["rank"]) == self.rank

    def on_event(self, event: Event) -> None:
        """A file event was logged (and written to the signature)."""
        kind = thread_kind(event)
        if self.fired:
            return  # a SIGTERM handler's save: past the point
        with self._lock:
            if not self.window.admit(event):
                return
            index = self.seen[kind]
            self.seen[kind] += 1
        point_kind = self.point["kind"]
        if point_kind == STEP:
            return  # inside the next step, not at an event of the save
        if point_kind == RETURNED and kind == "background":
            self.hold()  # the save gets no further: still in flight at the kill
            return
        if not self.mine or kind != self.point.get("thread", "main"):
            return
        if index != int(self.point["index"]):
            return
        if point_kind == WRITTEN:
            self.written = event
        elif point_kind == TORN:
            self.tear(event)
        elif point_kind == RETURNED:
            self.armed = True
        else:
            self.kill(f"after {describe(event, self.run_dir)}", event)

    def before_call(self, call: Optional[Event] = None) -> None:
        """A file call starts (`call`: its `op` and `path`): a file opened for writing at the
        point has been written, unless the call may write into it still (`torch.save` into
        the open file, or into a stream with no name, as DCP's writer does)."""
        if self.fired:
            return
        torn = self.torn
        if torn is not None and threading.current_thread() is torn[1]:
            path = os.path.realpath(call["path"]) if call and call.get("path") else ""
            into = call is not None and call.get("op") == "torch.save"
            if not into or path not in ("", torn[0].get("path")):
                self.cut(torn[0])
        if self.written is not None and threading.current_thread() is threading.main_thread():
            where = relative(str(self.written.get("path", "")), self.run_dir)
            self.kill(f"after writing {where} (closed, before the next file call)", self.written)

    def tear(self, event: Event) -> None:
        """The torn point's event: a saver's file is whole now, cut it; a file opened for
        writing is cut once written, at its thread's next file call (a writer thread that
        makes none: once it ends, or after `HOLD_LIMIT` seconds)."""
        if event.get("op") != "open":
            self.cut(event)
            return
        writer = threading.current_thread()
        self.torn = (event, writer)
        if writer is not threading.main_thread():
            threading.Thread(target=self._cut_once_ended, args=(writer,), daemon=True).start()

    def _cut_once_ended(self, writer: threading.Thread) -> None:
        deadline = time.monotonic() + HOLD_LIMIT
        while writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        torn = self.torn
        if torn is not None:
            self.cut(torn[0])

    def cut(self, event: Event) -> None:
        """Cut the file `event` wrote to half its size, then kill: killed inside the write."""
        with self._lock:
            if self.torn is None and event.get("op") == "open":
                return  # cut already, by another thread
            self.torn = None
        path = str(event.get("path", ""))
        try:
            size = os.path.getsize(path)
            os.truncate(path, size // 2)
        except OSError:
            size = 0
        where = f"inside {describe(event, self.run_dir)}: cut to {size_words(size // 2)}"
        torn = {"path": path, "size": size // 2, "of": size}
        self.kill(f"{where} of {size_words(size)}, then killed", event, torn)

    def on_record(self, step: int) -> None:
        """`record(step)` was called: past the save, once it has returned."""
        if self.fired:
            return
        self.last_step = step
        self.stepped.clear()
        split = int(self.point["split"])
        if self.point["kind"] == STEP and self.mine and step > split:
            self.kill(f"at record(step={step})", None)
            return
        if self.torn is not None and self.torn[1] is threading.current_thread():
            self.cut(self.torn[0])
        if self.written is not None:
            self.before_call()
        if self.armed and self.mine:
            self.kill(f"after the save returned, at record(step={step})", None)

    def hook_steps(self, optimizer: Any) -> None:
        """`torch.optim.optimizer` is imported: every optimizer step calls
        `before_optimizer_step` first and `after_optimizer_step` once done."""
        optimizer.register_optimizer_step_pre_hook(self.before_optimizer_step)
        optimizer.register_optimizer_step_post_hook(self.after_optimizer_step)

    def step_of(self, optimizer: Any) -> int:
        """The step an optimizer step of `optimizer` starting now belongs to: the one after
        the last recorded, or the one after that when `optimizer` has stepped since that
        record (the record of the step it took then comes later: at the next forward)."""
        return (self.last_step or 0) + 1 + (id(optimizer) in self.stepped)

    def after_optimizer_step(self, optimizer: Any, *_: Any) -> None:
        if not _initialising_state():
            self.stepped.add(id(optimizer))

    def before_optimizer_step(
        self, optimizer: Any = None, args: Any = (), kwargs: Any = None
    ) -> None:
        """An optimizer step starts (a global pre-step hook): kind "step" fires in the first
        one of a step after the split: between the step's backward and its update; given a
        closure (`step(closure)`, positional or keyword), which runs the forward and the
        backward inside the step, at its start."""
        if self.point["kind"] != STEP or not self.mine or self.fired or _initialising_state():
            return
        step = self.step_of(optimizer)
        if step <= int(self.point["split"]):
            return
        given = args[1:] if args and args[0] is optimizer else args  # torch passes self too
        closure = (kwargs or {}).get("closure") or (given[0] if given else None)
        if callable(closure):
            where = (
                f"inside step {step}, at the start of its optimizer step (before the "
                "closure it was given runs the step's forward and backward)"
            )
        else:
            where = f"inside step {step}, before its optimizer step"
        self.kill(where, None, inside=True, step=step, closure=callable(closure))

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

    def kill(
        self,
        where: str,
        event: Optional[Event],
        torn: Optional[Event] = None,
        inside: bool = False,
        step: Optional[int] = None,
        closure: bool = False,
    ) -> None:
        """Say where (and, inside a write, the file cut: `path`, `size`, `of`), then SIGKILL
        every rank of this host (this one last); a preempt point SIGTERMs them instead
        (`inside`: the SIGTERM comes inside `step`, before its optimizer step; `closure`: at
        the start of one given a closure, before the step's forward and backward)."""
        self.written = self.torn = None  # its own record is no file of the save
        preempt = self.point.get("preempt")
        self.fired = preempt is not None  # a SIGTERMed rank runs on: once only
        where = f"SIGTERM {where}" if preempt is not None else where
        record = {"rank": self.rank, "where": where, "event": event, "time_ns": time.time_ns()}
        if torn is not None:
            record["torn"] = torn
        if preempt is not None:
            record["preempt"] = {
                "grace": float(preempt),
                "sigterm": _disposition(signal.getsignal(signal.SIGTERM)),
                "after_step": self.last_step if step is None else step - 1,
                "inside_step": inside,
                "closure": closure,
            }
        path = crash_record_path(self.run_dir)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        me = os.getpid()
        pids = read_pids(self.run_dir)
        if preempt is not None:
            grace.start(self.run_dir, pids, float(preempt), time.monotonic())
        send = _terminate if preempt is not None else _kill
        for pid in pids.values():
            if pid != me:
                send(pid)
        send(me)  # a handler runs now, in the main thread; without one the rank ends here


def size_words(size: int) -> str:
    """`1.1 KiB`."""
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else f"{size / 2**20:.1f} MiB"


def _kill(pid: int) -> None:
    for send in (os.killpg, os.kill):
        try:
            send(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _terminate(pid: int) -> None:
    """SIGTERM one rank (not its group: as torchrun's agent and a cluster's stop signal it)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def _disposition(handler: Any) -> str:
    """What a SIGTERM does to the rank: "handler" (the trainer's), "ignored" or "default"."""
    if handler is signal.SIG_IGN:
        return "ignored"
    return "handler" if callable(handler) else "default"


def _hold() -> None:
    while True:
        time.sleep(3600)
