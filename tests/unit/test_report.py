"""The report's text and the typed records behind the summary table and the JSON report,
on hand-made outcomes: no launches."""

import json

from plan_helpers import plan_for, write_run

from pytest_resume_equiv.checks import Outcome, Verdict
from pytest_resume_equiv.checks.resume import judge_resume
from pytest_resume_equiv.compare.comparators import Exact
from pytest_resume_equiv.compare.jsonable import from_json, to_json
from pytest_resume_equiv.compare.tolerance import ComparisonRules
from pytest_resume_equiv.diagnose import Diagnosis
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.rank.run_dir import log_path
from pytest_resume_equiv.report.records import RunRecord, TestRecord, report_json
from pytest_resume_equiv.report.text import (
    format_launch_failure,
    format_outcome,
    format_plan_summary,
    format_summary_table,
    outcome_failure,
)
from pytest_resume_equiv.signature import read_run


def train(ctx):
    """Stands in for a trainer: nothing here runs it."""


def result_of(planned, ok=True, reused="", duration=1.25):
    ranks = [RankOutcome(0, "ok" if ok else "error", "" if ok else "ValueError: boom")]
    return LaunchResult(
        planned.spec, [0 if ok else 1], False, duration, ranks, "cd x && rerun", reused=reused
    )


def outcome_with(tmp_path, resumed_loss=lambda s, r: s / 2, **marker):
    """A plan's uninterrupted and resumed launches 'ran': their signatures are on disk, and
    the resume check judged them (its diagnosis left out: each test sets the one it needs)."""
    _, plan = plan_for(tmp_path, train, nproc=1, **marker)
    (full,), (resumed,) = plan.by_role("uninterrupted"), plan.by_role("resumed")
    write_run(full.spec.run_dir, range(1, 7))
    write_run(resumed.spec.run_dir, range(4, 7), loss=resumed_loss)
    base, res = read_run(full.spec.run_dir, 1), read_run(resumed.spec.run_dir, 1)
    outcome = Outcome(plan)
    outcome.launches = [result_of(full, reused="test_a.py::test_first"), result_of(resumed)]
    verdict = judge_resume(base, res, 3, Exact(ComparisonRules(6)), "resume", "split 3")
    verdict.diagnosis = None
    verdict.launch, verdict.rerun = resumed.name, outcome.launches[1].command
    verdict.runs = {"uninterrupted": full.spec.run_dir, "resumed": resumed.spec.run_dir}
    outcome.checks = [verdict]
    return plan, outcome


def with_teeth(outcome, status, why, comparison=None):
    """The outcome with a teeth check's verdict."""
    (launch,) = outcome.plan.by_role("teeth")
    teeth = Verdict("teeth", status, "teeth check", 3, why, comparison=comparison)
    teeth.launch, teeth.runs = launch.name, {"teeth": launch.spec.run_dir}
    outcome.checks.append(teeth)
    return outcome


def with_control_differing(outcome, control):
    """The outcome with a determinism control that differs as `control`'s resume did."""
    cmp = control.verdicts[0].comparison
    outcome.checks.append(Verdict("control", "failed", "determinism control", comparison=cmp))
    return outcome


def test_a_divergence_reads_top_down_with_cause_dirs_and_rerun_line(tmp_path):
    plan, outcome = outcome_with(tmp_path, resumed_loss=lambda s, r: s / 2 + (s == 5))
    outcome.verdicts[0].diagnosis = Diagnosis(
        "rank 0, step 5: something was not restored", "cpu RNG"
    )
    text = format_outcome(outcome, "kept: --resume-equiv-keep=failed")
    lines = text.splitlines()
    assert lines[0] == "resumed training is not equivalent to the uninterrupted run"
    assert lines[1] == "split 3: first divergence at step 5, rank 0, key 'loss': float differs"
    assert lines[2:4] == ["  [- uninterrupted] 2.5", "  [+ resumed]       3.5"]
    assert "  likely cause (cpu RNG): rank 0, step 5: something was not restored" in lines
    assert f"  uninterrupted: {plan.by_role('uninterrupted')[0].spec.run_dir}" in lines
    assert lines[-2:] == ["rerun the resumed launch by hand:", "  cd x && rerun"]


def test_a_toothless_test_says_so_instead_of_passing(tmp_path):
    plan, outcome = outcome_with(tmp_path)
    check = outcome.verdicts[0].comparison
    with_teeth(outcome, "failed", "values matched", check)
    assert not outcome.equal and outcome.resume_equal
    text = format_outcome(outcome, "kept: --resume-equiv-keep=failed")
    assert text.startswith(
        "this test has no teeth: every RNG stream was mutated right after step 4 of a resumed "
        "run (launch teeth-split3), and the recorded values at steps 5-6 still matched"
    )


def test_nondeterministic_training_is_not_blamed_on_the_resume(tmp_path):
    _, outcome = outcome_with(tmp_path, resumed_loss=lambda s, r: s)
    outcome.verdicts[0].diagnosis = Diagnosis("a cause that must not be shown", "x")
    _, control = outcome_with(tmp_path / "control", resumed_loss=lambda s, r: s + 1)
    with_control_differing(outcome, control)
    text = format_outcome(outcome, "kept")
    assert text.startswith("training is not deterministic even without a resume")
    assert "the resume is not to blame" in text and "a cause that must not be shown" not in text


def test_plan_summary_lists_launches_reuse_and_a_skipped_teeth_check(tmp_path):
    plan, outcome = outcome_with(tmp_path)
    with_teeth(outcome, "skipped", "nothing random")
    lines = format_plan_summary(outcome).splitlines()
    full = plan.by_role("uninterrupted")[0].spec.run_dir
    assert (
        lines[0]
        == f"uninterrupted: 1 rank, 1.2s, ok, {full} (reused: run for test_a.py::test_first)"
    )
    assert lines[1].startswith("resumed-split3: 1 rank, 1.2s, ok, ")
    assert lines[2:] == [
        "split 3: equal on its one rank over 3 steps",
        "teeth check skipped: nothing random",
    ]


def test_a_failed_launch_shows_the_failing_rank_first_with_its_last_lines(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=2)
    planned = plan.by_role("resumed")[0]
    ranks = [
        RankOutcome(0, "none", "stopped by torchrun (SIGTERM) after rank 1 failed", -15),
        RankOutcome(1, "error", "ValueError: boom", 1),
    ]
    run_dir = planned.spec.run_dir
    for rank, text in ((0, "waiting\n"), (1, "Traceback...\nValueError: boom\n")):
        path = log_path(run_dir, rank, "stderr")
        __import__("os").makedirs(__import__("os").path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    result = LaunchResult(planned.spec, [1], False, 2.0, ranks, "cd x && rerun")
    lines = format_launch_failure(result, "resumed").splitlines()
    assert lines[0] == "the resumed launch (resumed-split3) failed (2 ranks, 2.0s):"
    assert lines[1] == "  rank 1: ValueError: boom"  # the cause before its consequence
    assert lines[2] == "  rank 0: stopped by torchrun (SIGTERM) after rank 1 failed"
    assert "  ValueError: boom" in lines
    assert lines[-1] == "  rerun by hand: cd x && rerun"
    # a crash table's row says the cause too, not the rank stopped because of it (which rank
    # fails first on a torn checkpoint is a race: a CI run's row named rank 0's SIGTERM)
    from pytest_resume_equiv.checks.after_crash import _crash_text

    assert _crash_text(result) == "rank 1: ValueError: boom"


def test_records_round_trip_through_json_and_fill_the_summary_table(tmp_path):
    _, outcome = outcome_with(tmp_path, resumed_loss=lambda s, r: s)
    outcome.verdicts[0].diagnosis = Diagnosis(
        "rank 0, step 4: it was not restored",
        "cpu RNG",
        rule="step.cpu-rng",
        fix="save torch.get_rng_state()",
        evidence={"where": "rank 0, step 4", "stream": "cpu"},
    )
    with_teeth(outcome, "cancelled", "the resume from step 3 diverged")
    run = RunRecord.of(outcome, outcome_failure(outcome), ["a warning"])
    assert [(x.name, x.role) for x in run.launches] == [
        ("uninterrupted", "uninterrupted"),
        ("resumed-split3", "resumed"),
    ]
    record = TestRecord("t.py::test_b", "failed", "failed", 6, [3], 1, "cpu", 3.21, [run])
    other = TestRecord("t.py::test_a", "passed", "passed", 6, [3], 1, "cpu", 1.0, [])
    data = json.loads(json.dumps(to_json(record)))
    assert (data["launches"], data["reused_launches"]) == (2, 1)
    assert data["first_divergence"] == "split 3: step 4, rank 0, 'loss'"
    (verdict,) = data["runs"][0]["verdicts"]
    assert verdict["first_divergence"]["resumed"] == "4"
    assert verdict["likely_cause"] == {
        "class": "cpu RNG",
        "cause": "rank 0, step 4: it was not restored",
        "notes": [],
        "rule": "step.cpu-rng",
        "fix": "save torch.get_rng_state()",
        "evidence": {"where": "rank 0, step 4", "stream": "cpu"},
    }
    assert data["runs"][0]["teeth"] == {
        "status": "cancelled",
        "why": "the resume from step 3 diverged",
    }
    assert data["runs"][0]["control"] == {
        "ran": False,
        "deterministic": None,
        "first_difference": "",
    }
    assert data["runs"][0]["warnings"] == ["a warning"]
    assert [x["status"] for x in data["runs"][0]["launches"]] == ["ok", "ok"]
    assert from_json(TestRecord, data) == record
    report = report_json([record, other])
    assert report["format"] == "pytest-resume-equiv/report" and report["version"] == 1
    assert [t["test"] for t in report["tests"]] == ["t.py::test_a", "t.py::test_b"]
    table = format_summary_table([record, other])
    assert table[0].split() == [
        "test",
        "ranks",
        "splits",
        "launches",
        "wall",
        "verdict",
        "first",
        "divergence",
    ]
    assert table[2].split()[:7] == ["t.py::test_b", "1", "3", "2", "(1", "reused)", "3.2s"]
    assert table[2].endswith("failed   split 3: step 4, rank 0, 'loss'")
    props = dict(record.junit_properties())
    assert props["resume_equiv_launches"] == 2
    assert (
        props["resume_equiv_likely_cause"]
        == "split 3: cpu RNG: rank 0, step 4: it was not restored. Fix: save torch.get_rng_state()"
    )
    assert props["resume_equiv_teeth_check"] == "cancelled: the resume from step 3 diverged"
    assert props["resume_equiv_warnings"] == "a warning"
    assert (
        props["resume_equiv_proved"]
        == record.proved()
        == (
            "t.py::test_b failed: launches uninterrupted (reused: run for test_a.py::test_first), "
            "resumed-split3; teeth check cancelled (the resume from step 3 diverged)"
        )
    )


def test_a_killed_launch_is_killed_as_planned_and_an_interrupted_run_counts_what_ran(tmp_path):
    _, plan = plan_for(tmp_path, train, nproc=1, interrupt="kill")
    first = result_of(plan.by_role("interrupted")[0])
    first.killed_after_step = 4
    first.returncodes = [-9]
    outcome = Outcome(plan)
    outcome.launches = [result_of(plan.by_role("uninterrupted")[0]), first]
    assert first.status == "killed as planned"
    assert "interrupted-split3: 1 rank, 1.2s, killed as planned, " in format_plan_summary(outcome)
    run = RunRecord.of(outcome, "interrupted", stopped=[plan.by_role("resumed")[0]])
    assert [(x.name, x.status, x.ok) for x in run.launches] == [
        ("uninterrupted", "ok", True),
        ("interrupted-split3", "killed as planned", True),
        ("resumed-split3", "interrupted", False),
    ]
    record = TestRecord("t.py::test_k", "failed", "interrupted", 6, [3], 1, "cpu", 1.0, [run])
    assert (record.launches, record.first_divergence) == (3, "interrupted")


def test_every_failure_has_a_few_words_for_the_table(tmp_path):
    plan, outcome = outcome_with(tmp_path)
    with_teeth(outcome, "failed", "matched", outcome.verdicts[0].comparison)
    assert outcome_failure(outcome).startswith("no teeth: ")
    _, diverged = outcome_with(tmp_path / "d", resumed_loss=lambda s, r: s)
    _, control = outcome_with(tmp_path / "c", resumed_loss=lambda s, r: s + 1)
    with_control_differing(diverged, control)
    assert outcome_failure(diverged) == "not deterministic without a resume: step 4, rank 0, 'loss'"


def test_a_failed_verdict_whose_steps_matched_never_reads_equal_alone():
    """The gate failed (the resume point differs) while every compared step matched: both the
    summary's headline and the failure's block say what failed after "equal" (issue 40)."""
    from pytest_resume_equiv.checks.base import Verdict
    from pytest_resume_equiv.checks.resume import Resume
    from pytest_resume_equiv.compare.diff import Comparison
    from pytest_resume_equiv.compare.gate import GateFacts

    gate = GateFacts("failed", "the uninterrupted run", "", {"0": ["auto:batch"]}, 3, "t.py:9")
    cmp = Comparison(3, 6, 2, compared_steps=3, facts=[gate])
    verdict = Verdict("resume", "failed", "split 3", 3, comparison=cmp)
    expected = (
        "split 3: equal on all 2 ranks over 3 steps, but the test fails: resume point differs "
        "from the uninterrupted run's"
    )
    assert Resume.headline(verdict) == [expected]
    assert expected in Resume.block(verdict, None, "kept")
    passed = Verdict(
        "resume", "passed", "split 3", 3, comparison=Comparison(3, 6, 2, compared_steps=3)
    )
    assert Resume.headline(passed) == ["split 3: equal on all 2 ranks over 3 steps"]
