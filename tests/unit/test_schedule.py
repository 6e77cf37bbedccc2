"""The scheduler's mechanics with fake handles: start ahead, gates after needs, parallelism,
jobs added and cancelled by the handler, and nothing left running whatever happens."""

from types import SimpleNamespace

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv import schedule
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.schedule import Scheduler


def train(ctx):
    """Stands in for a trainer: nothing here runs it."""


class Fake:
    """A launch that finishes on its `ticks`-th poll after its gate opened."""

    def __init__(self, log, planned, gated, ticks):
        self.log, self.planned, self.gate_open, self.ticks = log, planned, not gated, ticks
        self.killed = self.finished = False
        log.append(("start", planned.name, gated))

    def open_gate(self):
        self.gate_open = True
        self.log.append(("gate", self.planned.name))

    def poll(self):
        assert self.gate_open and not self.killed
        self.ticks -= 1
        if self.ticks > 0:
            return None
        self.finished = True
        spec = self.planned.spec
        return LaunchResult(spec, [0], False, 0.0, [RankOutcome(0, "ok")], "fake")

    def kill(self):
        if not self.killed and not self.finished:
            self.killed = True
            self.log.append(("kill", self.planned.name))


def starter(log, ticks=2, refuse=()):
    handles = []

    def start(planned, gated):
        if planned.name in refuse:
            return None
        handles.append(Fake(log, planned, gated, ticks))
        return handles[-1]

    return start, handles


def test_a_launch_waits_at_its_gate_until_what_it_needs_was_handled(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, rng_mutation=False)
    log = []
    start, _ = starter(log)
    scheduler = Scheduler(start, parallel=2, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)
    scheduler.run(lambda job, result: log.append(("done", job.name)))
    assert log.index(("start", "resumed-split3", True)) < log.index(("done", "uninterrupted"))
    assert log.index(("gate", "resumed-split3")) > log.index(("done", "uninterrupted"))
    assert log[-1] == ("done", "resumed-split3")


@pytest.mark.parametrize("judged_first", [False, True])
def test_gates_open_once_a_launch_exited_or_if_asked_once_it_was_judged(tmp_path, judged_first):
    """With `on_exit`, the launches that need one open their gates while it is judged;
    a launch `judged_first` (a crash launch: its judging lays out what the restarted job
    finds) is judged before they open."""
    _, plan = plan_for(tmp_path, train, nproc=1, rng_mutation=False)
    uninterrupted = next(p for p in plan.started if p.name == "uninterrupted")
    uninterrupted.judged_first = judged_first
    log = []
    start, _ = starter(log)
    scheduler = Scheduler(start, parallel=2, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)
    scheduler.run(
        lambda job, result: log.append(("done", job.name)),
        lambda job, result: log.append(("exit", job.name)),
    )
    gate, done = log.index(("gate", "resumed-split3")), log.index(("done", "uninterrupted"))
    assert (gate > done) == judged_first, log


def test_no_more_than_parallel_launches_run_and_prefetch_start_ahead(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, split=[1, 2, 3, 4], rng_mutation=False)
    log, running, most = [], set(), [0]
    start, _ = starter(log, ticks=3)

    def done(job, result):
        running.discard(job.name)

    scheduler = Scheduler(start, parallel=2, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)
    while any(not j.done for j in scheduler.jobs):
        scheduler.loop_once(done)
        running.update(j.name for j in scheduler.jobs if j.started and j.handle.gate_open)
        most[0] = max(most[0], len(running))
        waiting = [j for j in scheduler.jobs if j.started and not j.handle.gate_open]
        assert len(waiting) <= 1
    assert most[0] == 2


def test_the_handler_adds_and_cancels_jobs_while_the_loop_runs(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1)
    log = []
    start, handles = starter(log, ticks=5)
    scheduler = Scheduler(start, parallel=1, prefetch=1, poll_interval=0)
    for planned in plan.started:  # the teeth check among them
        scheduler.add(planned)

    def done(job, result):
        log.append(("done", job.name))
        if job.name == "uninterrupted":
            scheduler.cancel(plan.named("teeth-split3"))
            scheduler.add(plan.named("uninterrupted-control"))

    scheduler.run(done)
    names = [e[1] for e in log if e[0] == "done"]
    assert names == ["uninterrupted", "resumed-split3", "uninterrupted-control"]
    assert not any(e == ("gate", "teeth-split3") for e in log)
    assert all(h.killed or h.finished for h in handles)


def test_a_handler_error_kills_every_started_launch(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, split=[2, 3])
    log = []
    start, handles = starter(log)
    scheduler = Scheduler(start, parallel=1, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)

    def done(job, result):
        raise RuntimeError("judged bad")

    with pytest.raises(RuntimeError, match="judged bad"):
        scheduler.run(done)
    assert handles and all(h.killed for h in handles[1:])
    assert ("kill", "resumed-split2") in log


def test_a_refused_start_is_asked_again(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, rng_mutation=False)
    log, refuse = [], {"resumed-split3"}
    start, _ = starter(log, refuse=refuse)
    scheduler = Scheduler(start, parallel=1, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)
    turns = 0
    while any(not j.done for j in scheduler.jobs):
        scheduler.loop_once(lambda job, result: None)
        turns += 1
        if turns == 5:
            refuse.clear()  # the devices came free
    assert ("start", "resumed-split3", True) in log and turns > 5


def test_progress_lines_name_the_launch_its_ranks_and_its_steps(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=2, rng_mutation=False)
    log, lines = [], []
    start, _ = starter(log)
    scheduler = Scheduler(start, poll_interval=0, on_progress=lines.append)
    for planned in plan.started:
        scheduler.add(planned)
    scheduler.run(lambda job, result: None)
    assert lines[0].startswith(
        "uninterrupted (2 ranks): running, step 0/6 recorded on every rank, "
    )
    assert lines[1].startswith("uninterrupted (2 ranks): ok, step 0/6 recorded on every rank, ")
    assert lines[2].startswith(
        "resumed-split3 (2 ranks): running, resuming after step 3 (to 6), no step recorded yet"
    )


def test_a_launch_says_running_once_then_once_per_period_of_its_own(tmp_path, monkeypatch):
    """A scheduler made long before its first launch starts does not follow that launch's
    "running" line with another at once: each launch's period counts from its own last line."""
    clock = [0.0]
    monkeypatch.setattr(schedule, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    _, plan = plan_for(tmp_path, train, nproc=1, rng_mutation=False)
    log, lines = [], []
    start, _ = starter(log, ticks=8)
    scheduler = Scheduler(start, poll_interval=0, on_progress=lines.append, progress_every=5)
    scheduler.add(plan.started[0])
    clock[0] = 60.0  # the first launch starts a minute after the scheduler was made
    while not scheduler.jobs[0].done:
        scheduler.loop_once(lambda job, result: None)
        clock[0] += 1.0
    said = [line.split(": ", 1)[1].split(",")[0] + line.rsplit(",", 1)[1] for line in lines]
    assert said == ["running 0.0s", "running 5.0s", "ok 7.0s"]


def test_unfinished_names_the_launches_running_when_the_loop_stopped(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, rng_mutation=False)
    log = []
    start, _ = starter(log, ticks=1000)
    scheduler = Scheduler(start, parallel=1, prefetch=1, poll_interval=0)
    for planned in plan.started:
        scheduler.add(planned)
    scheduler.loop_once(lambda job, result: None)
    # the uninterrupted launch runs; the resumed one waits at its gate: it did not run
    assert [p.name for p in scheduler.unfinished()] == ["uninterrupted"]
