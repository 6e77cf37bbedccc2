"""The Judge's handlers, one finished launch at a time, on signatures written by hand: what
each result means and which launches follow from it (no scheduler, no processes)."""

import os

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.launch import LaunchResult
from pytest_resume_equiv.orchestrate import LaunchFailed
from pytest_resume_equiv.outcomes import RankOutcome


def train(ctx):
    """A module-level function, as function mode needs."""


def plan_of(tmp_path, **marker):
    return plan_for(tmp_path, train, **{"nproc": 1, **marker})


class Recorder:
    """Stands in for the scheduler: remembers what a handler added and cancelled."""

    def __init__(self):
        self.added, self.cancelled = [], []

    def add(self, planned):
        self.added.append(planned.name)

    def cancel(self, planned):
        self.cancelled.append(planned.name)


def result_of(planned, ok=True, killed_after_step=0):
    spec = planned.spec
    ranks = [RankOutcome(r, "ok" if ok else "error", "" if ok else "boom") for r in range(1)]
    return LaunchResult(
        spec, [0 if ok else 1], False, 0.0, ranks, "rerun", killed_after_step=killed_after_step
    )


def judge_for(tmp_path, **marker):
    from pytest_resume_equiv.orchestrate import Judge

    settings, plan = plan_of(tmp_path, **marker)
    recorder = Recorder()
    judge = Judge(plan, settings, recorder)
    recorder.added.clear()  # the plan's own launches
    return judge, plan, recorder


def finish_uninterrupted(judge, plan, rng=lambda step, rank: f"s{step}"):
    from plan_helpers import write_run

    full = plan.uninterrupted[0]
    write_run(full.spec.run_dir, range(1, 7), rng=rng)
    for planned in plan.all_launches:
        if planned.checkpoint:
            os.makedirs(planned.checkpoint, exist_ok=True)
    judge.on_uninterrupted_done(full, result_of(full))


def test_on_uninterrupted_done_skips_the_teeth_check_when_no_stream_moves(tmp_path):
    judge, plan, recorder = judge_for(tmp_path)
    finish_uninterrupted(judge, plan, rng=lambda step, rank: "still")
    assert recorder.cancelled == ["teeth-split3"]
    assert judge.outcome.teeth.status == "skipped"


def test_on_uninterrupted_done_names_a_checkpoint_that_was_not_written(tmp_path):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    full = plan.uninterrupted[0]
    write_run(full.spec.run_dir, range(1, 7))
    os.makedirs(os.path.join(full.spec.run_dir, "ckpt-elsewhere"))
    with pytest.raises(ResumeEquivError) as info:
        judge.on_uninterrupted_done(full, result_of(full))
    assert "the uninterrupted run did not save a checkpoint at " in str(info.value)
    assert str(info.value).endswith("Its run directory holds: ckpt-elsewhere")


def test_on_resumed_done_compares_and_asks_for_one_control_per_uninterrupted_launch(tmp_path):
    from plan_helpers import write_run

    judge, plan, recorder = judge_for(tmp_path, split=[2, 3])
    finish_uninterrupted(judge, plan)
    for resumed in plan.resumed:
        write_run(resumed.spec.run_dir, range(resumed.splits[0] + 1, 7), loss=lambda s, r: s)
        judge.on_resumed_done(resumed, result_of(resumed))
    assert [v.split for v in judge.outcome.verdicts] == [2, 3]
    assert not any(v.comparison.equal for v in judge.outcome.verdicts)
    assert judge.outcome.verdicts[0].diagnosis is not None
    assert recorder.added == ["uninterrupted-control"]  # once, not once per split
    assert recorder.cancelled == ["teeth-split2"] and judge.outcome.teeth.status == "cancelled"


def test_on_resumed_done_equal_needs_no_control(tmp_path):
    from plan_helpers import write_run

    judge, plan, recorder = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    (resumed,) = plan.resumed
    write_run(resumed.spec.run_dir, range(4, 7))
    judge.on_resumed_done(resumed, result_of(resumed))
    assert judge.outcome.resume_equal and recorder.added == [] and recorder.cancelled == []


@pytest.mark.parametrize(("values_change", "status"), [(True, "passed"), (False, "failed")])
def test_on_teeth_done_judges_whether_the_test_has_teeth(tmp_path, values_change, status):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    loss = (lambda s, r: s * 3) if values_change else None
    write_run(plan.teeth.spec.run_dir, range(4, 7), loss=loss)
    judge.on_teeth_done(plan.teeth, result_of(plan.teeth))
    assert judge.outcome.teeth.status == status


def test_on_control_done_tells_nondeterministic_training_apart(tmp_path):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    control = plan.controls["uninterrupted"]
    write_run(control.spec.run_dir, range(1, 7), loss=lambda s, r: s + 0.25)
    judge.on_control_done(control, result_of(control))
    assert judge.outcome.nondeterministic is not None


def test_on_done_turns_a_failed_launch_into_launch_failed_with_its_role_and_cause(tmp_path):
    judge, plan, _ = judge_for(tmp_path, interrupt="kill")
    (first,) = plan.interrupted
    os.makedirs(plan.resumed[0].checkpoint)
    judge.on_done(FakeJob(first), result_of(first, ok=False, killed_after_step=4))
    assert judge.killed_after == {"interrupted-split3": 4}
    (resumed,) = plan.resumed
    with pytest.raises(LaunchFailed) as info:
        judge.on_done(FakeJob(resumed), result_of(resumed, ok=False))
    assert info.value.role == "resumed"
    assert "SIGKILLed once every rank had recorded step 4" in info.value.note


class FakeJob:
    def __init__(self, planned):
        self.planned = planned


def test_a_run_in_which_nothing_trains_is_warned_about(tmp_path):
    from plan_helpers import write_run

    from pytest_resume_equiv.orchestrate import nothing_trains
    from pytest_resume_equiv.signature import read_run

    write_run(tmp_path / "flat", range(1, 5), loss=lambda s, r: 1.0)
    write_run(tmp_path / "trains", range(1, 5))
    assert "nothing trains" in nothing_trains(read_run(str(tmp_path / "flat"), 1))
    assert nothing_trains(read_run(str(tmp_path / "trains"), 1)) == ""


@pytest.mark.parametrize("direct_diverges", [False, True])
def test_a_broken_chain_link_runs_a_direct_resume_to_tell_the_checkpoint_from_the_load(
    tmp_path, direct_diverges
):
    from plan_helpers import write_run

    from pytest_resume_equiv.report import format_outcome

    judge, plan, recorder = judge_for(tmp_path, split=[2, 4], chain=True)
    finish_uninterrupted(judge, plan)
    first, second = plan.resumed
    write_run(first.spec.run_dir, range(3, 7))
    os.makedirs(second.checkpoint, exist_ok=True)
    judge.on_resumed_done(first, result_of(first))
    write_run(second.spec.run_dir, range(5, 7), loss=lambda s, r: s)
    judge.on_resumed_done(second, result_of(second))
    assert recorder.added == ["resumed-split4-direct", "uninterrupted-control"]
    direct = plan.direct[second.name]
    write_run(direct.spec.run_dir, range(5, 7), loss=(lambda s, r: s) if direct_diverges else None)
    judge.on_direct_done(direct, result_of(direct))
    report = format_outcome(judge.outcome, "kept")
    assert "the chain broke at link 2 of 2 (resumed from step 4); link 1 matched" in report
    if direct_diverges:
        assert "diverges too (step 5, rank 0, 'loss'): the load path fails" in report
    else:
        assert "so the checkpoint chain link 1 saved after its own resume does not hold" in report
    assert "chain link 2 (resumed from step 4, from the checkpoint chain link 1 saved): first" in (
        report
    )


def test_a_resume_on_another_topology_is_judged_against_the_envelope(tmp_path):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path, nproc=2, resume_nproc=1)
    full, (other,), (resumed,) = plan.uninterrupted[0], plan.topology, plan.resumed
    ids = lambda s, r: [2 * s + r]  # noqa: E731
    write_run(full.spec.run_dir, range(1, 7), world_size=2, ids=ids)
    os.makedirs(resumed.checkpoint, exist_ok=True)
    judge.on_uninterrupted_done(full, result_of(full))
    write_run(other.spec.run_dir, range(1, 7), loss=lambda s, r: s / 2 + 1e-6, ids=ids)
    judge.on_topology_done(other, result_of(other))
    both = lambda s, r: [2 * s, 2 * s + 1]  # noqa: E731
    write_run(resumed.spec.run_dir, range(4, 7), ids=both)
    judge.on_resumed_done(resumed, result_of(resumed))
    (verdict,) = judge.outcome.verdicts
    assert verdict.comparison.equal and verdict.topology.data_exact
    assert verdict.topology.envelopes[0].key == "loss"
