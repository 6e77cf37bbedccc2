"""Verdicts on training that does not reproduce itself, judged on hand-made signatures with
the real judge and checks (no launches): the resume point is an exact gate, the trajectory is
judged within the noise measured between runs that should be the same, or abstains."""

import os

import pytest
from plan_helpers import write_run
from test_judge import done, judge_for

from pytest_resume_equiv.compare.noise import measure, rounding_level, size_words, ulps
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.signature import read_run

SPLIT = 3


def start(tmp_path, loss=lambda s, r: s / 2, **marker):
    """The uninterrupted launch finished, with a resume-point snapshot at the split."""
    judge, plan, recorder = judge_for(tmp_path, rng_mutation=False, **marker)
    (full,) = plan.by_role("uninterrupted")
    write_run(full.spec.run_dir, range(1, 7), loss=loss, points=[SPLIT])
    for planned in plan.launches:
        if planned.checkpoint:
            os.makedirs(planned.checkpoint, exist_ok=True)
    done(judge, full)
    return judge, plan, recorder


def resume(judge, plan, loss, point=None, name="resumed-split3"):
    kwargs = {"point": point} if point else {}
    launch = plan.named(name)
    write_run(launch.spec.run_dir, range(SPLIT + 1, 7), loss=loss, points=[SPLIT], **kwargs)
    done(judge, launch)


def control(judge, plan, loss):
    (launch,) = plan.by_role("control")
    write_run(launch.spec.run_dir, range(1, 7), loss=loss, points=[SPLIT])
    done(judge, launch)


def the_resume(judge):
    (verdict,) = judge.conclude().verdicts
    return verdict


def test_noise_everywhere_a_correct_resume_passes_within_the_measured_noise(tmp_path):
    judge, plan, recorder = start(tmp_path)
    resume(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * (s - SPLIT))
    assert the_resume(judge).failed and recorder.added == ["uninterrupted-control"]
    control(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * s)
    verdict = the_resume(judge)
    assert verdict.status == "passed", verdict
    assert verdict.why.startswith("within 4x the measured noise (the uninterrupted run and its")
    assert judge.conclude().equal


def test_noise_does_not_hide_a_resume_point_that_differs(tmp_path):
    """Optimizer moments zeroed after the load: the later values are within the noise, but a
    load is a copy and the resume point differs."""
    judge, plan, _ = start(tmp_path)
    wrong = lambda split, rank: {"rng": {"cpu": f"s{split}"}, "watch": {"opt.state": "zeros"}}  # noqa: E731
    resume(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * (s - SPLIT), point=wrong)
    control(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * s)
    verdict = the_resume(judge)
    assert verdict.failed and "the resume point differs all the same" in verdict.why
    (gate,) = [f for f in verdict.facts if f.kind == "gate"]
    assert gate.differing == {"0": ["watch:model.params", "watch:opt.state"]}
    assert "A load is a copy" in gate.lines("split 3")[0]


def test_a_difference_beyond_the_measured_noise_fails_with_the_cause_unknown(tmp_path):
    judge, plan, _ = start(tmp_path)
    resume(judge, plan, loss=lambda s, r: s / 2 + (0.5 if s == 5 else 1e-7))
    control(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * s)
    verdict = the_resume(judge)
    assert verdict.failed and verdict.why == "beyond 4x the measured noise"
    assert verdict.comparison.divergence.step == 5
    assert verdict.diagnosis.bug_class == "beyond the measured noise"
    assert "the resume point matched exactly" in verdict.diagnosis.cause


@pytest.mark.parametrize("repeat_drifts", [True, False])
def test_noise_only_in_the_resumed_process_is_told_apart(tmp_path, repeat_drifts):
    """The uninterrupted run reproduces itself, the state loaded exactly, and the first
    resumed step differs at rounding level: a fresh process computing differently. A repeat
    of the resume measures its noise; one that agrees bit for bit leaves nothing to judge."""
    judge, plan, recorder = start(tmp_path)
    resume(judge, plan, loss=lambda s, r: s / 2 + 1e-9 * (s - SPLIT))
    first = the_resume(judge)
    assert first.diagnosis.bug_class == "resumed-process compute"
    assert "the resumed process computes step 4 differently at rounding level" in (
        first.diagnosis.cause
    )
    control(judge, plan, loss=lambda s, r: s / 2)
    assert recorder.added == ["uninterrupted-control", "resumed-split3-repeat"]
    drift = 2e-9 if repeat_drifts else 1e-9
    resume(judge, plan, loss=lambda s, r: s / 2 + drift * (s - SPLIT), name="resumed-split3-repeat")
    verdict = the_resume(judge)
    if repeat_drifts:
        assert verdict.status == "passed" and "two resumed processes" in verdict.why
    else:
        assert verdict.status == "abstained"
        assert "the resumed process repeats itself exactly" in verdict.why


def test_noise_too_wide_to_judge_abstains(tmp_path):
    judge, plan, _ = start(tmp_path)
    resume(judge, plan, loss=lambda s, r: s / 2 * 1.1)
    control(judge, plan, loss=lambda s, r: s / 2 * (1.5 if s > 1 else 1))
    verdict = the_resume(judge)
    assert verdict.status == "abstained" and "too wide to tell a bug from it" in verdict.why
    outcome = judge.conclude()
    assert outcome.equal and outcome.abstained == [verdict]


def test_noise_beyond_the_tests_tolerance_abstains(tmp_path):
    judge, plan, _ = start(tmp_path, tolerance="strict")
    resume(judge, plan, loss=lambda s, r: s / 2 + 1e-4 * (s - SPLIT))
    control(judge, plan, loss=lambda s, r: s / 2 + 1e-4 * s)
    verdict = the_resume(judge)
    assert verdict.status == "abstained" and "exceeds tolerance=strict" in verdict.why


def test_noise_off_fails_as_not_deterministic(tmp_path):
    judge, plan, _ = start(tmp_path, noise="off")
    resume(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * (s - SPLIT))
    control(judge, plan, loss=lambda s, r: s / 2 + 1e-7 * s)
    outcome = judge.conclude()
    assert the_resume(judge).failed and outcome.nondeterministic is not None


def test_a_deterministic_trainer_that_passes_runs_nothing_extra(tmp_path):
    judge, plan, recorder = start(tmp_path)
    resume(judge, plan, loss=lambda s, r: s / 2)
    assert the_resume(judge).status == "passed" and recorder.added == []


def test_measure_runs_the_controls_from_the_start(tmp_path):
    judge, plan, recorder = judge_for(tmp_path, noise="measure", options={"noise_runs": 3})
    assert [p.name for p in plan.started if p.role == "control"] == [
        "uninterrupted-control",
        "uninterrupted-control2",
    ]


def test_the_spread_is_a_running_maximum_per_rank_key_and_step(tmp_path):
    write_run(tmp_path / "a", range(1, 5), loss=lambda s, r: float(s))
    write_run(tmp_path / "b", range(1, 5), loss=lambda s, r: s + (0.5 if s == 2 else 0.0))
    a, b = read_run(str(tmp_path / "a"), 1), read_run(str(tmp_path / "b"), 1)
    noise = measure(a, [b], 1, 4, "uninterrupted", [])
    assert [noise.at(0, "loss", s) for s in (1, 2, 3, 4)] == [0.0, 0.5, 0.5, 0.5]
    assert noise.relative == {"loss": 0.25} and noise.noisy


def test_sizes_in_words():
    one, near = encode(1.0, "x"), encode(1.0 + 2**-52, "x")
    assert ulps(1.0, 1.0 + 2**-52) == 1
    assert size_words(one, near) == "relative 2.2e-16, 1 ulps: differs at rounding level"
    assert size_words(one, encode(1.5, "x")).endswith("differs materially")
    assert rounding_level(one, near) and not rounding_level(one, encode(2.0, "x"))


def test_a_key_the_few_runs_saw_equal_may_still_drift_at_rounding_level(tmp_path):
    """Two uninterrupted runs drifted in the weights' statistics but happened to record the
    same loss: a loss computed from drifting weights is judged at rounding level, not bit for
    bit; a material difference still fails."""
    from test_compare import sig

    from pytest_resume_equiv.compare.comparators import Measured
    from pytest_resume_equiv.compare.noise import NoiseFacts

    judge, _, _ = judge_for(tmp_path, rng_mutation=False)
    noise = NoiseFacts(
        "uninterrupted", spread={"0": {"norm": {"4": 1e-9}}}, relative={"norm": 1e-9}
    )

    def run(phase, steps, loss):
        return {0: sig(0, phase, [(s, {"loss": loss(s), "norm": 1.0}) for s in steps], 1)}

    base = run("uninterrupted", range(1, 7), lambda s: 0.03 * s)
    close = run("resumed", range(4, 7), lambda s: 0.03 * s * (1 + 6.5e-8))
    far = run("resumed", range(4, 7), lambda s: 0.03 * s * (1 + 1e-2))
    assert Measured(judge.rules, noise).compare(base, close, SPLIT).equal
    assert not Measured(judge.rules, noise).compare(base, far, SPLIT).equal
    assert not Measured(judge.rules, NoiseFacts("uninterrupted")).compare(base, close, SPLIT).equal


def test_a_gate_that_failed_on_the_first_steps_inputs_alone_says_the_data_moved():
    """Every restored state matched; only the first resumed step's inputs (auto:data) differ:
    no load restored something other than what was saved, the data was not put back."""
    from pytest_resume_equiv.compare.gate import GateFacts

    data = GateFacts("failed", differing={"0": ["auto:data"], "1": ["auto:data"]}, at="train.py:9")
    (line,) = data.lines("split 3")
    assert "every restored state equals the uninterrupted run's, but the first resumed step" in line
    assert "consumed other data: rank 0: auto:data; rank 1: auto:data" in line
    assert "A load is a copy" not in line
    state = GateFacts("failed", differing={"0": ["rng:cpu", "auto:data"]}, at="train.py:9")
    assert "A load is a copy" in state.lines("split 3")[0]
