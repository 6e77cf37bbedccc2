"""crash_mode="preempt": what a SIGTERM with a grace did, read from what the preempted launch
left: the crash record (where the SIGTERM came, what the sending rank's SIGTERM disposition
was), the watchdog's outcome (`rank/grace.py`: every rank exited within the grace, or which
were SIGKILLed at its end) and the launch's own file events (its signatures' `files`).

The SIGTERM handler's save is found in those events, not guessed: the writes the launch
logged after the SIGTERM, less the rest of the split's save (the uninterrupted run's events of
that save after the point, matched in order by call and path), which a trainer that stops at
its next step boundary finishes first. The step it holds is their `after_step` (the last step
recorded before them): a save that came inside a step, before that step was recorded, holds
the step before, whatever the trainer calls it. Pure, except `read_outcome`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..compare.comparators import Run
from ..diagnose.at_crash import WRITE_CALLS
from ..diagnose.at_preemption import inside_words
from ..launch.rank_exits import stuck_where
from ..launch.running import LaunchResult
from ..rank.crasher import STEP, describe, relative, save_events, thread_kind
from ..rank.grace import outcome_path
from ..rank.run_dir import signature_path
from ..signature import SignatureError, read_signature
from .after_crash import read_crash_record
from .crash_points import CrashPoint

Event = dict[str, Any]
OUTCOME_WAIT = 2.0
"""Seconds the host waits, once the launch has ended, for the watchdog to say so too."""


@dataclass
class Preempted:
    """One preempt point's facts (JSON-able: `Stage.CRASH` reads them as a dict)."""

    grace: float
    sigterm: str
    """The sending rank's SIGTERM disposition: "handler", "default" or "ignored"."""
    after_step: Optional[int]
    """The last step done when the SIGTERM came (inside a step: the step before it)."""
    inside_step: bool
    """The SIGTERM came inside a step, between its backward and its optimizer step (or at the
    start of an optimizer step given a closure: `closure`)."""
    closure: bool = False
    """Inside a step whose optimizer step was given a closure: at its start, before the
    closure ran the step's forward and backward."""
    killed: list[int] = field(default_factory=list)
    """The ranks still running at the end of the grace, SIGKILLed then."""
    exited_s: Optional[float] = None
    """Seconds from the SIGTERM until the last rank had exited (none killed)."""
    saved: list[str] = field(default_factory=list)
    """The handler's own writes after the SIGTERM, in words (relative paths)."""
    saved_step: Optional[int] = None
    """The step the handler's save holds (its writes' `after_step`)."""
    finished_save: bool = False
    """The split's own save was whole before the launch ended."""
    last: dict[int, str] = field(default_factory=dict)
    """A killed rank: its last file event, in words ("" when it logged none after the SIGTERM)."""
    stuck: dict[int, str] = field(default_factory=dict)
    """A killed rank: where its stack was when the grace ran out."""
    exits: str = ""
    """How the ranks ended when one did not exit cleanly (an error in the handler)."""
    recorded_through: Optional[int] = None
    """The last step every rank of the preempted launch recorded (None: a rank recorded
    none, or left no signature)."""

    @property
    def mid_step(self) -> bool:
        """The handler saved inside the step the SIGTERM came in, before it was recorded."""
        return bool(self.saved) and self.inside_step and self.saved_step == self.after_step

    @property
    def completed_save(self) -> bool:
        """The handler's save completed: it wrote, nothing was killed, every rank exited
        cleanly, and it came at a step boundary."""
        return bool(self.saved) and not self.killed and not self.exits and not self.mid_step

    @property
    def inside_words(self) -> str:
        """Where inside its step the SIGTERM came."""
        return inside_words(self.closure)

    def words(self) -> str:
        """What happened after the SIGTERM, for the point's row."""
        if self.sigterm == "default" and not self.killed:
            return "no SIGTERM handler: the ranks died of it, as of a kill"
        if self.killed:
            ranks = ", ".join(
                f"rank {r}"
                + (f" last after {self.last[r]}" if self.last.get(r) else "")
                + (f", {self.stuck[r]}" if self.stuck.get(r) else "")
                for r in self.killed
            )
            words = f"still running after the {self.grace:g} s grace: killed ({ranks})"
            if self.saved:
                writes = f"{len(self.saved)} write{'s' * (len(self.saved) != 1)}"
                words += f"; its save of step {self.saved_step} had begun ({writes} after the "
                words += "SIGTERM)"
            return words
        words = f"every rank exited within the grace ({self.exited_s or 0:.2f} s)"
        if self.exits:
            words += f" ({self.exits})"
        if self.mid_step:
            return (
                f"{words}, the handler saved inside step {(self.after_step or 0) + 1} "
                f"({self.inside_words}: the state of step {self.saved_step})"
            )
        if self.saved:
            return f"{words}, the handler saved step {self.saved_step}"
        return f"{words}, the handler saved nothing more"

    def facts(self) -> dict[str, Any]:
        return {
            "grace": self.grace,
            "sigterm": self.sigterm,
            "after_step": self.after_step,
            "inside_step": self.inside_step,
            "closure": self.closure,
            "recorded_through": self.recorded_through,
            "killed": list(self.killed),
            "exited_s": self.exited_s,
            "saved": list(self.saved),
            "saved_step": self.saved_step,
            "mid_step": self.mid_step,
            "completed_save": self.completed_save,
            "last": {str(r): w for r, w in self.last.items()},
            "stuck": {str(r): w for r, w in self.stuck.items()},
        }


def read_outcome(run_dir: str, wait: float = OUTCOME_WAIT) -> Optional[dict[str, Any]]:
    """The watchdog's outcome, waiting up to `wait` seconds for it (the launch can end a
    moment before the watchdog sees its last rank gone)."""
    deadline = time.monotonic() + wait
    while True:
        found = read_crash_record(outcome_path(run_dir))
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


Key = tuple[str, str, str]


def event_key(event: Event, run_dir: str) -> Key:
    """An event as two launches can compare it: its call and paths relative to its run
    directory."""
    path, to = (relative(str(event.get(k) or ""), run_dir) for k in ("path", "to"))
    return (str(event.get("op")), path, to)


def handler_writes(
    logs: dict[int, list[Event]], sent_ns: int, rest: list[Key], rank: int, run_dir: str
) -> tuple[list[Event], bool]:
    """The writes of the handler's own save (every rank's, after the SIGTERM at `sent_ns`;
    `logs` written in `run_dir`), and whether the split's save finished: on the point's
    `rank`, the events after the SIGTERM that match the uninterrupted run's `rest` of that
    save (`event_key`s), in order, are that save's."""
    found: list[Event] = []
    finished = not rest
    for number, log in sorted(logs.items()):
        after = [e for e in log if int(e.get("time_ns") or 0) >= sent_ns]
        if number == rank and rest:
            matched = 0
            for event in after:
                if matched < len(rest) and event_key(event, run_dir) == rest[matched]:
                    matched += 1
                elif matched < len(rest):
                    break
            finished = matched == len(rest)
            after = after[matched:] if finished else after
        found += [e for e in after if e.get("op") in WRITE_CALLS]
    return found, finished


def preempted(
    record: dict[str, Any],
    outcome: Optional[dict[str, Any]],
    logs: dict[int, list[Event]],
    rest: list[Key],
    rank: int,
    run_dir: str,
) -> Preempted:
    """The facts of one preempt point from its crash `record`, the watchdog's `outcome`, the
    preempted launch's file events per rank (`logs`) and the uninterrupted run's events of the
    split's save after the point on its `rank` (`rest`; all of it for a point inside a step
    is past: [])."""
    said = record.get("preempt") or {}
    sent_ns = int(record.get("time_ns") or 0)
    writes, finished = handler_writes(logs, sent_ns, rest, rank, run_dir)
    steps = [int(e["after_step"]) for e in writes if e.get("after_step") is not None]
    killed = [int(r) for r in (outcome or {}).get("killed") or []]
    last = {}
    for number in killed:
        after = [e for e in logs.get(number, []) if int(e.get("time_ns") or 0) >= sent_ns]
        last[number] = describe(after[-1], run_dir) if after else ""
    return Preempted(
        grace=float(said.get("grace", (outcome or {}).get("grace", 0.0))),
        sigterm=str(said.get("sigterm", "default")),
        after_step=said.get("after_step"),
        inside_step=bool(said.get("inside_step")),
        closure=bool(said.get("closure")),
        killed=killed,
        exited_s=(outcome or {}).get("exited_s"),
        saved=[describe(e, run_dir) for e in writes],
        saved_step=max(steps) if steps else None,
        finished_save=finished,
        last=last,
        stuck={r: stuck_where(run_dir, r) for r in killed},
    )


def preempt_point(
    point: CrashPoint,
    record: dict[str, Any],
    result: LaunchResult,
    full: Run,
    full_dir: str,
    splits: tuple[int, ...],
) -> Preempted:
    """The facts of a preempt point whose launch (`result`) has ended, against the
    uninterrupted run `full` (written in `full_dir`)."""
    run_dir = result.spec.run_dir
    logs, lasts = {}, []
    for rank in range(result.spec.world_size):
        try:
            signature = read_signature(signature_path(run_dir, rank))
        except SignatureError:  # a rank ended before it wrote any
            continue
        logs[rank] = signature.files
        lasts += [max(step[0] for step in signature.steps)] if signature.steps else []
    rest: list[Key] = []
    if point.kind != STEP and point.rank in full:
        window = save_events(full[point.rank].files, point.split, splits, full_dir)
        kind = [i for i, e in enumerate(window) if thread_kind(e) == point.thread]
        if point.index < len(kind):
            rest = [event_key(e, full_dir) for e in window[kind[point.index] + 1 :]]
    found = preempted(record, read_outcome(run_dir), logs, rest, point.rank, run_dir)
    if found.sigterm != "default":
        found.exits = exits_words(result.ranks)
    if len(lasts) == result.spec.world_size:
        found.recorded_through = min(lasts)
    return found


def exits_words(ranks: list[Any]) -> str:
    """How ranks that did not end cleanly ended ("rank 0: exited with code 1"), from the
    launch's per-rank outcomes; "" when every one did."""
    bad = [o for o in ranks if not o.ok and o.status != "shutdown"]
    return "; ".join(f"rank {o.rank}: {o.detail}" for o in bad)


__all__ = ["Preempted", "event_key", "handler_writes", "preempt_point", "preempted"]


def preempt_steps(
    found: Optional[Preempted], completed: list[int], split: int
) -> tuple[list[int], tuple[int, ...]]:
    """A preempt point: the checkpoints that had completed (the split's save, when it
    finished after the SIGTERM; the handler's own, when it completed within the grace), and
    the steps its handler's save may be taken for (the step it holds; a save inside a step,
    the step the trainer was in too)."""
    if found is None:
        return completed, ()
    done = set(completed)
    if found.finished_save:
        done.add(split)
    if found.completed_save and found.saved_step is not None:
        done.add(found.saved_step)
    saved: tuple[int, ...] = ()
    if found.saved_step is not None:
        saved = (found.saved_step, found.saved_step + 1) if found.mid_step else (found.saved_step,)
    return sorted(done), saved
