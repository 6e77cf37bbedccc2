"""Start, gate, poll and kill launches; hand each finished one to a handler. No policy.

The loop knows only mechanics: how many launches may run the user's code at once
(`parallel`), how many more may be started ahead, waiting at their gate (`prefetch`), and that
a launch may open its gate once the launches it `needs` have finished. What a result means,
and which launches follow from it, is the handler's business (judge.py and the checks): it may add
and cancel jobs while the loop runs. Like pytest-xdist's `DSession.loop_once`, each turn
starts what it can, then dispatches what finished; with nothing finished, it blocks until a
launch's process exits or the next deadline comes (`launch.waiting`), not on a fixed sleep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from .launch.running import Handle, LaunchResult, RunningLaunch
from .launch.waiting import POLL, Wake, wait
from .plan import PlannedLaunch
from .signature import StepWatcher, count

Starter = Callable[[PlannedLaunch, bool], Optional[Handle]]
"""Start a planned launch, gated (waiting for `open_gate()`) or not; None: not now (no free
device yet), ask again later."""


def start_local(planned: PlannedLaunch, gated: bool) -> Handle:
    return RunningLaunch(planned.spec, gated=gated)


@dataclass
class Job:
    planned: PlannedLaunch
    handle: Optional[Handle] = None
    done: bool = False
    """Finished (handed to the handler) or cancelled."""
    gate_opened_at: float = 0.0
    said_at: float = 0.0
    """When its last progress line was printed: the next comes `progress_every` later."""
    watcher: Optional[StepWatcher] = None
    """Follows the launch's signatures (interrupt="kill", progress lines)."""

    @property
    def name(self) -> str:
        return self.planned.name

    @property
    def started(self) -> bool:
        return self.handle is not None and not self.done

    def steps_recorded(self) -> int:
        """The last step every rank of this launch has recorded so far."""
        if self.watcher is None:
            spec = self.planned.spec
            self.watcher = StepWatcher(spec.run_dir, spec.world_size)
        self.watcher.refresh()
        return self.watcher.lowest


OnDone = Callable[[Job, LaunchResult], None]


class Scheduler:
    def __init__(
        self,
        start: Starter = start_local,
        parallel: int = 1,
        prefetch: int = 1,
        poll_interval: float = POLL,
        on_progress: Optional[Callable[[str], None]] = None,
        progress_every: float = 5.0,
    ) -> None:
        self.start = start
        self.parallel = parallel
        self.prefetch = prefetch
        self.poll_interval = poll_interval
        """How often what cannot wake the loop is looked at (a launch waiting for a device,
        one that another pytest-xdist worker runs, the steps of an interrupt="kill" launch)."""
        self._refused = False
        """This turn's starter had no device free: ask again after `poll_interval`."""
        self.on_progress = on_progress
        self.progress_every = progress_every
        self.jobs: list[Job] = []
        self.finished: set[str] = set()

    def add(self, planned: PlannedLaunch) -> None:
        self.jobs.append(Job(planned))

    def cancel(self, planned: PlannedLaunch) -> None:
        """Drop a launch that can no longer matter; kill it if it started."""
        for job in self.jobs:
            if job.planned is planned and not job.done:
                if job.handle is not None:
                    job.handle.kill()
                job.done = True

    def unfinished(self) -> list[PlannedLaunch]:
        """Launches that were running the user's code and never finished (the run was stopped
        in the middle); not those still waiting at their gate."""
        return [job.planned for job in self.jobs if job.started and job.handle.gate_open]

    def run(self, on_done: OnDone, on_exit: Optional[OnDone] = None) -> None:
        """Until every job is done. Whatever ends it (a handler's exception, Ctrl-C), every
        started launch is killed before this returns.

        `on_exit`, if given, is what must hold of a finished launch before the launches that
        need it may run (it raises otherwise): their gates open right after it, and
        `on_done`, which reads and compares signatures, runs while they run."""
        try:
            while any(not job.done for job in self.jobs):
                if not self.loop_once(on_done, on_exit):
                    wait(self.wake())
        finally:
            self._kill_started()

    def _kill_started(self) -> None:
        """Kill every started launch. A second Ctrl-C cuts one kill's wait short, never the
        kills of the launches after it; it is raised once all were killed."""
        second: Optional[BaseException] = None
        for job in self.jobs:
            if job.handle is None:
                continue
            try:
                job.handle.kill()
            except KeyboardInterrupt as exc:
                second = exc
        if second is not None:
            raise second

    def loop_once(self, on_done: OnDone, on_exit: Optional[OnDone] = None) -> bool:
        """One turn: start, open gates, report progress, dispatch finished launches.
        Returns whether any launch finished."""
        self._start_what_fits()
        self._open_gates()
        self._periodic_progress()
        return self._dispatch_finished(on_done, on_exit)

    def wake(self) -> Wake:
        """What ends the wait after a turn in which nothing finished: the exit of a running
        launch's process (each handle says), its timeout, the next progress line; a look
        after `poll_interval` at what only polling can see."""
        wake = Wake()
        if self.on_progress is not None:
            for job in self.jobs:
                if job.started and job.handle.gate_open:
                    wake.by(job.said_at + self.progress_every)
        soon = time.monotonic() + self.poll_interval
        if self._refused:
            wake.by(soon)
        for job in self.jobs:
            if not job.started or not job.handle.gate_open:
                continue
            handle_wake = getattr(job.handle, "wake", None)
            if handle_wake is None:  # a handle that cannot say (a fake): polled
                wake.by(soon)
            else:
                wake.add(handle_wake())
            if job.planned.kill_after is not None:
                wake.by(soon)  # its signatures grow: only a look shows the step
        return wake

    def _ready(self, job: Job) -> bool:
        return all(p.name in self.finished for p in job.planned.needs)

    def _start_what_fits(self) -> None:
        """Start pending launches gated, up to `parallel` running plus `prefetch` waiting."""
        active = [j for j in self.jobs if j.started]
        self._refused = False
        for job in self.jobs:
            if job.done or job.handle is not None:
                continue
            waiting = sum(not j.handle.gate_open for j in active)
            could_run = self._ready(job) and len(active) < self.parallel
            if len(active) >= self.parallel + self.prefetch or (
                waiting >= self.prefetch and not could_run
            ):
                return
            handle = self.start(job.planned, True)
            if handle is None:
                self._refused = True
                return  # no free device yet: ask again next turn
            job.handle = handle
            active.append(job)
            if handle.gate_open:  # a launch that reads no checkpoint (a shared one) runs now
                job.gate_opened_at = time.monotonic()
                self._progress(job, "running")

    def _open_gates(self) -> None:
        active = [j for j in self.jobs if j.started]
        running = sum(j.handle.gate_open for j in active)
        for job in active:
            if running >= self.parallel:
                return
            if not job.handle.gate_open and self._ready(job):
                job.handle.open_gate()
                job.gate_opened_at = time.monotonic()
                running += 1
                self._progress(job, "running")

    def _periodic_progress(self) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        for job in self.jobs:  # each launch's own clock: no line right after its "running"
            if job.started and job.handle.gate_open and now - job.said_at >= self.progress_every:
                self._progress(job, "running")

    def _dispatch_finished(self, on_done: OnDone, on_exit: Optional[OnDone] = None) -> bool:
        finished_any = False
        for job in list(self.jobs):
            if not job.started or not job.handle.gate_open:
                continue
            result = self._poll(job)
            if result is None:
                continue
            self._progress(
                job, f"{result.status} ({result.note})" if result.note else result.status
            )
            job.done = True
            if on_exit is not None and not job.planned.judged_first:
                on_exit(job, result)
                self.finished.add(job.name)
                self._open_gates()  # what waited for it runs while it is judged
            on_done(job, result)
            self.finished.add(job.name)
            finished_any = True
        return finished_any

    def _poll(self, job: Job) -> Optional[LaunchResult]:
        result = job.handle.poll()
        kill_after = job.planned.kill_after
        if result is None and kill_after is not None and job.steps_recorded() >= kill_after:
            job.handle.kill()  # SIGKILL: the interruption this launch is for
            result = job.handle.poll()
            if result is not None:
                result.killed_after_step = kill_after
        return result

    def _progress(self, job: Job, event: str) -> None:
        if self.on_progress is None:
            return
        job.said_at = time.monotonic()
        spec = job.planned.spec
        elapsed = time.monotonic() - job.gate_opened_at if job.gate_opened_at else 0.0
        recorded, ctx = job.steps_recorded(), spec.context
        where = f"step {recorded}/{ctx.steps} recorded on every rank"
        if not recorded and ctx.phase in ("resumed", "teeth") and ctx.split is not None:
            where = f"resuming after step {ctx.split} (to {ctx.steps}), no step recorded yet"
            if job.planned.may_fail:  # interrupt="crash": the trainer finds where
                where = "resuming from what the crash left, no step recorded yet"
        self.on_progress(
            f"{spec.name} ({count(spec.world_size, 'rank')}): {event}, {where}, {elapsed:.1f}s"
        )
