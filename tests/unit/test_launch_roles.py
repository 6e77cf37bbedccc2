"""The roles of a resume test's launches, run by the real scheduler over fake launches:
gates, concurrency, the teeth check, the determinism control, failures, cleanup.

A fake launch "runs" for a few scheduler ticks and then writes the signature a trainer would
have written, so these tests check ordering and judgement without starting processes.
"""

import json
import os

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.judge import LaunchFailed, run_plan
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.rank.layout import SIGNATURE_FORMAT, SIGNATURE_VERSION
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.rank.template import fill
from pytest_resume_equiv.schedule import Scheduler


def train(ctx):
    """Stands in for a trainer: the fakes below never import or call it."""


def header(rank, world_size):
    head = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "phase": "x"}
    return json.dumps({**head, "rank": rank, "world_size": world_size}) + "\n"


class Machine:
    """Fake launches plus a log of what happened in which order."""

    def __init__(self, ticks=3, diverge=(), fail=(), rng_moves=True, mutation_matters=True):
        self.ticks = ticks
        self.diverge = set(diverge)
        self.fail = set(fail)
        self.rng_moves = rng_moves
        self.mutation_matters = mutation_matters
        self.events = []
        self.handles = []

    def start(self, planned, gated):
        handle = FakeLaunch(self, planned, gated)
        self.handles.append(handle)
        self.events.append(("start", planned.spec.name, gated))
        return handle

    def running_now(self):
        return [h.name for h in self.handles if h.gate_open and h.result is None and not h.killed]


class FakeLaunch:
    def __init__(self, machine, planned, gated):
        self.machine = machine
        self.planned = planned
        self.name = planned.spec.name
        self.gate_open = not gated
        self.left = machine.ticks
        self.result = None
        self.killed = False
        self.steps = None

    def open_gate(self):
        self.gate_open = True
        self.machine.events.append(("gate", self.name, tuple(self.machine.running_now())))

    def poll(self):
        """One tick: write the next step's record on every rank, or finish."""
        if self.result is not None:
            return self.result
        assert self.gate_open
        spec = self.planned.spec
        ctx = spec.context
        phase, split = ctx.phase, ctx.split
        if self.steps is None:
            first = split + 1 if phase in ("resumed", "teeth") else 1
            self.steps = list(range(first, ctx.steps + 1))
            for rank in range(spec.world_size):
                os.makedirs(os.path.dirname(signature_path(spec.run_dir, rank)), exist_ok=True)
                with open(signature_path(spec.run_dir, rank), "w") as f:
                    f.write(header(rank, spec.world_size))
        self.left -= 1
        if self.left > 0:
            return None
        if self.steps:
            step = self.steps.pop(0)
            wrong = self.name in self.machine.diverge and step > split + 1
            mutated = phase == "teeth" and self.machine.mutation_matters and step > split + 1
            value = step * 0.5 + (1.0 if wrong else 0.0) + (2.0 if mutated else 0.0)
            rng = {"cpu": f"s{step}" if self.machine.rng_moves else "fixed"}
            for rank in range(spec.world_size):
                with open(signature_path(spec.run_dir, rank), "a") as f:
                    f.write(json.dumps({"rng": rng, "step": step, "values": {"loss": value}}))
                    f.write("\n")
            if phase in ("uninterrupted", "interrupted") and step in ctx.splits:
                values = {**ctx.template_values, "split": step}
                os.makedirs(fill(ctx.checkpoint_template, values, "checkpoint="))
            self.left = 1
            return None
        for rank in range(spec.world_size):
            with open(signature_path(spec.run_dir, rank), "a") as f:
                f.write(json.dumps({"end": {"records": 0}}) + "\n")
        ok = self.name not in self.machine.fail
        self.result = LaunchResult(
            spec=spec,
            returncodes=[0 if ok else 1],
            timed_out=False,
            duration=0.0,
            ranks=[RankOutcome(r, "ok" if ok else "error") for r in range(spec.world_size)],
            command="fake",
        )
        self.machine.events.append(("done", self.name))
        return self.result

    def kill(self):
        if self.result is None and not self.killed:
            self.killed = True
            self.machine.events.append(("kill", self.name))
            spec = self.planned.spec
            self.result = LaunchResult(spec, [-9], False, 0.0, [], command="fake")


def plan_of(tmp_path, **marker):
    return plan_for(tmp_path, train, **{"nproc": 1, **marker})


def run(tmp_path, machine, parallel=1, prefetch=1, **marker):
    settings, plan = plan_of(tmp_path, **marker)
    scheduler = Scheduler(machine.start, parallel, prefetch, poll_interval=0)
    return run_plan(plan, settings, scheduler)


@pytest.mark.parametrize("parallel", [1, 2])
def test_resumed_launch_is_prestarted_but_gated_until_the_uninterrupted_one_exits(
    tmp_path, parallel
):
    machine = Machine()
    outcome = run(tmp_path, machine, parallel=parallel, rng_mutation=False)
    assert outcome.equal
    events = machine.events
    assert ("start", "resumed-split3", True) in events
    started = events.index(("start", "resumed-split3", True))
    assert started < events.index(
        ("done", "uninterrupted")
    )  # imports overlap the uninterrupted launch
    gate = next(i for i, e in enumerate(events) if e[:2] == ("gate", "resumed-split3"))
    assert gate > events.index(("done", "uninterrupted"))  # never reads a checkpoint in progress


def test_no_more_than_parallel_launches_run_at_once(tmp_path):
    for parallel in (1, 2):
        machine = Machine()
        outcome = run(tmp_path / str(parallel), machine, parallel=parallel, split=[1, 2, 3, 4])
        assert [v.split for v in outcome.verdicts] == [1, 2, 3, 4]
        gates = [e for e in machine.events if e[0] == "gate"]
        assert max(len(e[2]) for e in gates) == parallel
        started_gated = [e for e in machine.events if e[0] == "start" and e[2]]
        assert started_gated


def test_teeth_check_runs_after_equal_resumes_and_catches_toothless_signatures(tmp_path):
    machine = Machine(mutation_matters=False)
    outcome = run(tmp_path, machine)
    assert outcome.resume_equal and outcome.teeth.status == "failed" and not outcome.equal
    assert outcome.teeth.comparison.equal
    assert ("done", "teeth-split3") in machine.events


def test_teeth_check_is_skipped_when_no_rng_stream_moves(tmp_path):
    machine = Machine(rng_moves=False, mutation_matters=False)
    outcome = run(tmp_path, machine)
    assert outcome.equal and outcome.teeth.status == "skipped"
    assert "no audited RNG stream advances" in outcome.teeth.why
    assert not any(e[1] == "teeth-split3" and e[0] in ("gate", "done") for e in machine.events)


def test_a_divergence_cancels_the_teeth_check_and_runs_the_determinism_control(tmp_path):
    machine = Machine(diverge={"resumed-split3"})
    outcome = run(tmp_path, machine, parallel=2)
    assert not outcome.resume_equal and outcome.nondeterministic is None
    assert ("done", "uninterrupted-control") in machine.events
    assert not any(e[:2] == ("done", "teeth-split3") for e in machine.events)


def test_a_passing_test_runs_no_determinism_control(tmp_path):
    machine = Machine()
    run(tmp_path, machine)
    assert not any(e[1] == "uninterrupted-control" for e in machine.events)


def test_a_failed_uninterrupted_launch_kills_every_prestarted_launch(tmp_path):
    machine = Machine(fail={"uninterrupted"})
    with pytest.raises(LaunchFailed) as info:
        run(tmp_path, machine, split=[2, 3])
    assert info.value.result.spec.name == "uninterrupted" and info.value.role == "uninterrupted"
    assert ("kill", "resumed-split2") in machine.events
    assert all(h.result is not None or h.killed for h in machine.handles)


def test_missing_checkpoint_is_reported_before_any_resumed_launch_runs(tmp_path):
    machine = Machine()
    settings, plan = plan_of(tmp_path, rng_mutation=False)
    original = FakeLaunch.poll

    def no_checkpoint(self):
        result = original(self)
        if result is not None and self.name == "uninterrupted":
            os.rmdir(plan.by_role("resumed")[0].checkpoint)
        return result

    FakeLaunch.poll = no_checkpoint
    try:
        with pytest.raises(ResumeEquivError, match="did not save a checkpoint"):
            run_plan(plan, settings, Scheduler(machine.start, poll_interval=0))
    finally:
        FakeLaunch.poll = original
    assert not any(e[:2] == ("gate", "resumed-split3") for e in machine.events)
    assert ("kill", "resumed-split3") in machine.events


def test_ctrl_c_while_waiting_kills_every_started_launch(tmp_path):
    machine = Machine(ticks=1000)
    settings, plan = plan_of(tmp_path)
    calls = {"n": 0}
    original = FakeLaunch.poll

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self)

    FakeLaunch.poll = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            run_plan(plan, settings, Scheduler(machine.start, poll_interval=0))
    finally:
        FakeLaunch.poll = original
    assert machine.handles and all(h.killed for h in machine.handles)


def test_a_device_that_is_not_free_yet_delays_the_start(tmp_path):
    machine = Machine()
    refusals = {"n": 0}

    def busy_then_free(planned, gated):
        if planned.spec.name.startswith("resumed") and refusals["n"] < 3:
            refusals["n"] += 1
            return None
        return machine.start(planned, gated)

    settings, plan = plan_of(tmp_path, rng_mutation=False)
    outcome = run_plan(plan, settings, Scheduler(busy_then_free, poll_interval=0))
    assert outcome.equal and refusals["n"] == 3


def test_interrupt_stop_resumes_from_a_first_launch_that_ends_at_the_split(tmp_path):
    machine = Machine()
    outcome = run(tmp_path, machine, rng_mutation=False, interrupt="stop")
    assert outcome.equal
    first = next(h for h in machine.handles if h.name == "interrupted-split3")
    assert first.planned.spec.context.steps == 3  # {steps} is the split: it stops there
    gate = next(i for i, e in enumerate(machine.events) if e[:2] == ("gate", "resumed-split3"))
    assert gate > machine.events.index(("done", "interrupted-split3"))
    assert gate > machine.events.index(("done", "uninterrupted"))
    resumed = next(h for h in machine.handles if h.name == "resumed-split3")
    assert "/interrupted-split3/" in resumed.planned.checkpoint


def test_interrupt_kill_kills_the_first_launch_after_the_step_after_the_split(tmp_path):
    machine = Machine()
    outcome = run(tmp_path, machine, rng_mutation=False, interrupt="kill")
    assert outcome.equal
    assert ("kill", "interrupted-split3") in machine.events
    first = next(h for h in machine.handles if h.name == "interrupted-split3")
    assert first.steps == [5, 6]  # steps 1-4 recorded, then SIGKILLed
    (killed,) = [r for r in outcome.launches if r.spec.name == "interrupted-split3"]
    assert killed.killed_after_step == 4


# The handlers one by one, on synthetic results: no scheduler loop, no launches.
