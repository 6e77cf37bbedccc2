"""The judge and its checks, one finished launch at a time, on signatures written by hand:
what each result means and which launches follow from it (no scheduler, no processes)."""

import os

import pytest
from plan_helpers import plan_for

from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.judge import LaunchFailed
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult


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
    from pytest_resume_equiv.judge import Judge

    settings, plan = plan_of(tmp_path, **marker)
    recorder = Recorder()
    judge = Judge(plan, settings, recorder)
    recorder.added.clear()  # the plan's own launches
    return judge, plan, recorder


def done(judge, planned, **result):
    """`planned` finished: the judge dispatches it to the checks that wait for it."""
    judge.on_done(FakeJob(planned), result_of(planned, **result))


def finish_uninterrupted(judge, plan, rng=lambda step, rank: f"s{step}"):
    from plan_helpers import write_run

    full = plan.by_role("uninterrupted")[0]
    write_run(full.spec.run_dir, range(1, 7), rng=rng)
    for planned in plan.launches:
        if planned.checkpoint:
            os.makedirs(planned.checkpoint, exist_ok=True)
    done(judge, full)


def verdicts(judge):
    return judge.conclude().verdicts


def teeth(judge):
    return judge.conclude().teeth


def test_the_teeth_check_is_skipped_when_no_stream_moves(tmp_path):
    judge, plan, recorder = judge_for(tmp_path)
    finish_uninterrupted(judge, plan, rng=lambda step, rank: "still")
    assert recorder.cancelled == ["teeth-split3"]
    assert teeth(judge).status == "skipped"


def test_a_checkpoint_that_was_not_written_is_named_with_what_was(tmp_path):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    full = plan.by_role("uninterrupted")[0]
    write_run(full.spec.run_dir, range(1, 7))
    os.makedirs(os.path.join(full.spec.run_dir, "ckpt-elsewhere"))
    with pytest.raises(ResumeEquivError) as info:
        done(judge, full)
    assert "the uninterrupted run did not save a checkpoint at " in str(info.value)
    assert str(info.value).endswith("Its run directory holds: ckpt-elsewhere")


def test_a_diverged_resume_asks_for_one_control_per_uninterrupted_launch(tmp_path):
    from plan_helpers import write_run

    judge, plan, recorder = judge_for(tmp_path, split=[2, 3])
    finish_uninterrupted(judge, plan)
    for resumed in plan.by_role("resumed"):
        write_run(resumed.spec.run_dir, range(resumed.split + 1, 7), loss=lambda s, r: s)
        done(judge, resumed)
    assert [v.split for v in verdicts(judge)] == [2, 3]
    assert not any(v.comparison.equal for v in verdicts(judge))
    assert verdicts(judge)[0].diagnosis is not None
    assert recorder.added == ["uninterrupted-control"]  # once, not once per split
    assert recorder.cancelled == ["teeth-split2"] and teeth(judge).status == "cancelled"


def test_an_equal_resume_needs_no_control(tmp_path):
    from plan_helpers import write_run

    judge, plan, recorder = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    (resumed,) = plan.by_role("resumed")
    write_run(resumed.spec.run_dir, range(4, 7))
    done(judge, resumed)
    assert judge.conclude().resume_equal and recorder.added == [] and recorder.cancelled == []


@pytest.mark.parametrize(("values_change", "status"), [(True, "passed"), (False, "failed")])
def test_the_teeth_check_judges_whether_the_test_has_teeth(tmp_path, values_change, status):
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    loss = (lambda s, r: s * 3) if values_change else None
    (launch,) = plan.by_role("teeth")
    write_run(launch.spec.run_dir, range(4, 7), loss=loss)
    done(judge, launch)
    assert teeth(judge).status == status


@pytest.mark.parametrize("noise", ["off", "auto"])
def test_the_determinism_control_tells_nondeterministic_training_apart(tmp_path, noise):
    """With noise="off" a control that differs fails the test as not deterministic; with
    "auto" it measures the noise (only numbers drift here) for the resumes to be judged in."""
    from plan_helpers import write_run

    from pytest_resume_equiv.compare.noise import NoiseFacts

    judge, plan, _ = judge_for(tmp_path, noise=noise)
    finish_uninterrupted(judge, plan)
    (control,) = plan.by_role("control")
    write_run(control.spec.run_dir, range(1, 7), loss=lambda s, r: s / 2 + 0.25)
    done(judge, control)
    outcome = judge.conclude()
    (verdict,) = [v for v in outcome.checks if v.check == "control"]
    (measured,) = [f for f in verdict.facts if isinstance(f, NoiseFacts)]
    assert measured.at(0, "loss", 1) == 0.25 and measured.unjudgeable == []
    if noise == "off":
        assert outcome.nondeterministic is not None and verdict.failed
    else:
        assert outcome.nondeterministic is None and verdict.status == "passed"
        assert "the uninterrupted run does not reproduce itself bitwise" in verdict.why


def test_a_control_that_differs_in_what_no_noise_explains_is_not_deterministic(tmp_path):
    """An RNG stream (or an int, a string) that differs between uninterrupted runs cannot
    drift by noise: the old verdict, whatever the noise setting."""
    from plan_helpers import write_run

    judge, plan, _ = judge_for(tmp_path)
    finish_uninterrupted(judge, plan)
    (control,) = plan.by_role("control")
    write_run(control.spec.run_dir, range(1, 7), rng=lambda step, rank: f"other{step}")
    done(judge, control)
    assert judge.conclude().nondeterministic is not None


def test_a_failed_launch_is_launch_failed_with_its_role_and_cause(tmp_path):
    judge, plan, _ = judge_for(tmp_path, interrupt="kill")
    (first,) = plan.by_role("interrupted")
    (resumed,) = plan.by_role("resumed")
    os.makedirs(resumed.checkpoint)
    done(judge, first, ok=False, killed_after_step=4)
    assert judge.result(first).killed_after_step == 4
    with pytest.raises(LaunchFailed) as info:
        done(judge, resumed, ok=False)
    assert info.value.role == "resumed"
    assert "SIGKILLed once every rank had recorded step 4" in info.value.note


def test_a_kill_that_came_after_the_launch_ended_is_warned_about(tmp_path):
    """A fast trainer can finish all its steps between two looks of the host: its split then
    tested no kill, which the report must say (a CI run of a zoo trainer met it)."""
    judge, plan, _ = judge_for(tmp_path, interrupt="kill")
    (first,) = plan.by_role("interrupted")
    os.makedirs(plan.by_role("resumed")[0].checkpoint, exist_ok=True)
    judge.on_exit(FakeJob(first), result_of(first, ok=True, killed_after_step=0))
    (warning,) = judge.outcome.warnings
    assert warning.startswith(
        f"the {first.name} launch ran to its end before the SIGKILL planned once every rank "
        f"had recorded step {first.kill_after} could land"
    )
    last, plan3, _ = judge_for(tmp_path / "c", interrupt="kill", steps=4, split=3)
    (first3,) = plan3.by_role("interrupted")
    os.makedirs(plan3.by_role("resumed")[0].checkpoint, exist_ok=True)
    last.on_exit(FakeJob(first3), result_of(first3, ok=False, killed_after_step=4))
    (warning,) = last.outcome.warnings  # killed, but after the run's last step
    assert "once every rank has recorded step 4, its last (steps=4)" in warning
    killed_in_time, plan2, _ = judge_for(tmp_path / "b", interrupt="kill")
    (first2,) = plan2.by_role("interrupted")
    os.makedirs(plan2.by_role("resumed")[0].checkpoint, exist_ok=True)
    killed_in_time.on_exit(FakeJob(first2), result_of(first2, ok=False, killed_after_step=4))
    assert killed_in_time.outcome.warnings == []


class FakeJob:
    def __init__(self, planned):
        self.planned = planned


def test_a_run_in_which_nothing_trains_is_warned_about(tmp_path):
    from plan_helpers import write_run

    from pytest_resume_equiv.checks.resume import nothing_trains
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

    from pytest_resume_equiv.report.text import format_outcome

    judge, plan, recorder = judge_for(tmp_path, split=[2, 4], chain=True)
    finish_uninterrupted(judge, plan)
    first, second = plan.by_role("resumed")
    write_run(first.spec.run_dir, range(3, 7))
    os.makedirs(second.checkpoint, exist_ok=True)
    done(judge, first)
    write_run(second.spec.run_dir, range(5, 7), loss=lambda s, r: s)
    done(judge, second)
    assert recorder.added == ["resumed-split4-direct", "uninterrupted-control"]
    direct = plan.named("resumed-split4-direct")
    write_run(direct.spec.run_dir, range(5, 7), loss=(lambda s, r: s) if direct_diverges else None)
    done(judge, direct)
    report = format_outcome(judge.conclude(), "kept")
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

    from pytest_resume_equiv.compare.envelope import TopologyFacts

    judge, plan, _ = judge_for(tmp_path, nproc=2, resume_nproc=1)
    (full,), (other,) = plan.by_role("uninterrupted"), plan.by_role("topology")
    (resumed,) = plan.by_role("resumed")
    ids = lambda s, r: [2 * s + r]  # noqa: E731
    write_run(full.spec.run_dir, range(1, 7), world_size=2, ids=ids)
    os.makedirs(resumed.checkpoint, exist_ok=True)
    done(judge, full)
    write_run(other.spec.run_dir, range(1, 7), loss=lambda s, r: s / 2 + 1e-6, ids=ids)
    done(judge, other)
    both = lambda s, r: [2 * s, 2 * s + 1]  # noqa: E731
    write_run(resumed.spec.run_dir, range(4, 7), ids=both)
    done(judge, resumed)
    (verdict,) = verdicts(judge)
    (held,) = [f for f in verdict.every_fact if isinstance(f, TopologyFacts)]
    assert verdict.comparison.equal and held.data_exact
    assert held.envelopes[0].key == "loss"


def _saving_run(files, steps=range(1, 6)):
    from pytest_resume_equiv.signature import Signature

    header = {"rank": 0, "world_size": 1, "phase": "uninterrupted"}
    return {0: Signature("rank-0.jsonl", header, [(s, {}) for s in steps], True, files=files)}


def test_a_checkpoint_saved_again_is_warned_about_from_what_the_run_did(tmp_path):
    from pytest_resume_equiv.checks.resume import saved_again

    ckpt = str(tmp_path / "ckpt")
    once = [{"op": "torch.save", "path": f"{ckpt}/state.pt", "after_step": 2, "time_ns": 1}]
    again = once + [{"op": "os.replace", "path": "/x/tmp", "to": ckpt, "after_step": 4}]
    other = once + [{"op": "torch.save", "path": f"{ckpt}-4/state.pt", "after_step": 4}]
    assert saved_again(_saving_run(once), 2, ckpt) == ""
    assert saved_again(_saving_run(other), 2, ckpt) == ""  # another path that starts alike
    text = saved_again(_saving_run(again), 2, ckpt)
    assert text.startswith(f"split 2: the run that saved {ckpt} at step 2 wrote to it again ")
    assert "after step 4 (rank 0: os.replace)" in text and "put {split} in the path" in text


def test_a_stopping_launch_that_trained_on_is_warned_about():
    from pytest_resume_equiv.checks.resume import went_past

    assert went_past(_saving_run([], range(1, 3)), 2, "interrupted-split2") == ""
    text = went_past(_saving_run([], range(1, 6)), 2, "interrupted-split2")
    assert "should end at step 2 but recorded up to step 5" in text


def test_the_teeth_advice_on_another_topology_offers_no_escape():
    """Turning the teeth check off on a resume onto fewer ranks would let a wrong resume pass
    (only values the same on every rank are compared there): the advice never says so."""
    from pytest_resume_equiv.checks.base import Verdict
    from pytest_resume_equiv.checks.teeth import Teeth
    from pytest_resume_equiv.compare.diff import Comparison

    def text(runs):
        cmp = Comparison(split=3, steps=6, world_size=1)
        verdict = Verdict("teeth", "failed", "teeth check", 3, comparison=cmp, runs=runs)
        return "\n".join(Teeth.block(verdict, None, "kept"))

    assert "pass rng_mutation=False" in text({"teeth": "/r/teeth"})
    topology = text({"teeth": "/r/teeth", "topology": "/r/other"})
    assert "rng_mutation=False" not in topology and "the loss after an all-reduce" in topology


def test_a_resumed_launch_that_writes_over_what_it_loaded_is_warned_about(tmp_path):
    from pytest_resume_equiv.checks.resume import wrote_what_it_loaded

    path = str(tmp_path / "out" / "ckpt.pt")
    run = _saving_run([{"op": "torch.save", "path": path, "after_step": 6}])
    assert wrote_what_it_loaded(run, "resumed-split3") == ""  # it loaded nothing there
    run[0].restores.append({"call": "torch.load", "what": f"file {path}"})
    text = wrote_what_it_loaded(run, "resumed-split3")
    assert text.startswith("the launch 'resumed-split3' wrote to a checkpoint file it had loaded")
    beside = _saving_run([{"op": "torch.save", "path": path + ".new", "after_step": 6}])
    beside[0].restores.append({"call": "torch.load", "what": f"file {path}"})
    assert wrote_what_it_loaded(beside, "resumed-split3") == ""
