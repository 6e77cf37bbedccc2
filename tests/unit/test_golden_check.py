"""The golden trajectory check with a fake judge and signatures written by hand: an update run
writes the golden, a normal run compares the uninterrupted run with it, a missing or newer
golden is a clear failure, and without a store nothing changes."""

import json
import os

import pytest
from plan_helpers import plan_for, write_run

from pytest_resume_equiv.compare.jsonable import from_json, to_json
from pytest_resume_equiv.errors import ResumeEquivError
from pytest_resume_equiv.golden import Environment, GoldenMeta, GoldenStore, GoldenTarget
from pytest_resume_equiv.judge import Judge
from pytest_resume_equiv.launch.rank_exits import RankOutcome
from pytest_resume_equiv.launch.running import LaunchResult
from pytest_resume_equiv.report.records import RunRecord, TestRecord
from pytest_resume_equiv.report.text import format_golden_summary, format_outcome

ENV = Environment("cpu", 0, 1, "2.13.0")
TEST = "tests/test_t.py::test_resumes"


def train(ctx):
    """A module-level function, as function mode needs."""


class Recorder:
    def __init__(self):
        self.added, self.cancelled = [], []

    def add(self, planned):
        self.added.append(planned.name)

    def cancel(self, planned):
        self.cancelled.append(planned.name)


class FakeJob:
    def __init__(self, planned):
        self.planned = planned


def target(tmp_path, update=False, env=ENV, session="s"):
    return GoldenTarget(GoldenStore(str(tmp_path / "goldens")), TEST, env, update, session=session)


def judge_for(tmp_path, golden, **marker):
    settings, plan = plan_for(
        tmp_path / "runs", train, golden=golden, **{"nproc": 1, "rng_mutation": False, **marker}
    )
    judge = Judge(plan, settings, Recorder())
    return judge, plan


def done(judge, planned):
    ranks = [RankOutcome(0, "ok", "")]
    judge.on_done(FakeJob(planned), LaunchResult(planned.spec, [0], False, 0.0, ranks, "rerun"))


def run_uninterrupted(judge, plan, loss=None):
    full = plan.by_role("uninterrupted")[0]
    write_run(full.spec.run_dir, range(1, 7), loss=loss)
    for planned in plan.launches:
        if planned.checkpoint:
            os.makedirs(planned.checkpoint, exist_ok=True)
            with open(os.path.join(planned.checkpoint, "state.bin"), "wb") as f:
                f.write(b"x" * 10)
    done(judge, full)
    return full


def golden_verdict(judge):
    return next(v for v in judge.conclude().checks if v.check == "golden")


def write_golden(tmp_path, loss=None, **marker):
    judge, plan = judge_for(tmp_path / "update", target(tmp_path, update=True), **marker)
    run_uninterrupted(judge, plan, loss)
    return golden_verdict(judge)


def test_without_a_store_the_plan_is_what_it_was(tmp_path):
    _, plain = plan_for(tmp_path, train, nproc=1)
    _, with_store = plan_for(tmp_path, train, nproc=1, golden=target(tmp_path, update=True))
    assert [p.name for p in plain.launches] == [p.name for p in with_store.launches]
    assert not any(c.kind == "golden" for c in plain.checks)
    assert not (tmp_path / "goldens").exists()


def test_an_update_run_writes_the_golden_and_says_where(tmp_path):
    verdict = write_golden(tmp_path)
    path = tmp_path / "goldens" / "tests_test_t.py__test_resumes" / ENV.key
    assert verdict.status == "skipped"
    assert verdict.why == f"update run: wrote the golden {ENV.key} to {path}"
    assert sorted(os.listdir(path / "signatures")) == ["rank-0.jsonl"]
    run = RunRecord([], verdicts=[verdict])
    record = TestRecord(TEST, "passed", "passed", 6, [3], 1, "cpu", 0.0, [run])
    record = from_json(TestRecord, json.loads(json.dumps(to_json(record))))  # from a worker
    assert format_golden_summary([record], [], False) == [
        f"{TEST}: wrote the golden {ENV.key} to {path}"
    ]


def test_golden_checkpoint_stores_the_checkpoint_of_every_split_with_its_size(tmp_path):
    verdict = write_golden(tmp_path, golden_checkpoint=True, split=[2, 4])
    assert verdict.why.endswith("(checkpoints split 2: 10 bytes, split 4: 10 bytes)")
    golden = GoldenStore(str(tmp_path / "goldens")).load(TEST, ENV.key)
    assert sorted(golden.meta.checkpoints) == [2, 4]
    assert os.listdir(golden.checkpoint(2)) == ["state.bin"]


def test_the_same_trajectory_passes(tmp_path):
    write_golden(tmp_path)
    judge, plan = judge_for(tmp_path, target(tmp_path))
    run_uninterrupted(judge, plan)
    verdict = golden_verdict(judge)
    assert verdict.status == "passed", verdict.why
    assert verdict.comparison.compared_steps == 6
    assert verdict.why.startswith("golden written 20") and ENV.key in verdict.why


def test_a_change_that_moves_the_training_fails_with_the_goldens_first_difference(tmp_path):
    write_golden(tmp_path)
    judge, plan = judge_for(tmp_path, target(tmp_path))
    run_uninterrupted(judge, plan, loss=lambda step, rank: step / 2 if step < 2 else step / 3)
    verdict = golden_verdict(judge)
    assert verdict.failed
    assert verdict.first_difference() == "step 2, rank 0, 'loss'"
    outcome = judge.conclude()
    assert not outcome.equal
    text = format_outcome(outcome, "kept")
    assert "golden trajectory: the uninterrupted run differs from the golden written" in text
    assert "golden trajectory: first divergence at step 2, rank 0, key 'loss'" in text
    assert "  [- golden]        1.0" in text
    assert "  [+ uninterrupted] 0.6666666666666666" in text
    assert "--resume-equiv-update-golden" in text


def test_the_tests_tolerance_applies_to_the_golden_too(tmp_path):
    write_golden(tmp_path)
    judge, plan = judge_for(tmp_path, target(tmp_path), tolerance=(1e-3, 0.0))
    run_uninterrupted(judge, plan, loss=lambda step, rank: step / 2 * (1 + 1e-6))
    assert golden_verdict(judge).status == "passed"


def test_no_golden_for_this_environment_names_the_ones_there_are(tmp_path):
    write_golden(tmp_path)
    other = Environment("cpu", 0, 1, "2.14.0")
    judge, plan = judge_for(tmp_path, target(tmp_path, env=other))
    run_uninterrupted(judge, plan)
    verdict = golden_verdict(judge)
    assert verdict.failed
    assert verdict.why == (
        f"no golden for {other.key} (have: {ENV.key}); run with --resume-equiv-update-golden"
    )
    assert verdict.why in format_outcome(judge.conclude(), "kept")


def test_a_newer_golden_fails_the_test_before_any_launch(tmp_path):
    write_golden(tmp_path)
    path = tmp_path / "goldens" / "tests_test_t.py__test_resumes" / ENV.key / "golden.json"
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ResumeEquivError, match="golden format version 99 is newer than this"):
        judge_for(tmp_path, target(tmp_path))


def test_unused_goldens_are_listed_and_whether_they_were_removed():
    assert format_golden_summary([], ["tests/a.py::gone"], False) == [
        "unused goldens (1, no collected test uses them), not removed; an update run "
        "(--resume-equiv-update-golden) removes them:",
        "  tests/a.py::gone",
    ]
    assert "removed (--resume-equiv-update-golden)" in format_golden_summary([], ["x"], True)[0]


def finish(judge, planned, steps, loss=None):
    write_run(planned.spec.run_dir, steps, loss=loss)
    done(judge, planned)


def compat_verdicts(judge):
    return [v for v in judge.conclude().checks if v.check == "compat"]


def test_a_golden_checkpoint_is_resumed_by_the_current_code_in_a_launch_of_its_own(tmp_path):
    write_golden(tmp_path, golden_checkpoint=True)
    judge, plan = judge_for(tmp_path, target(tmp_path), golden_checkpoint=True)
    assert [p.name for p in plan.started] == [
        "uninterrupted",
        "resumed-split3",
        "golden-resumed-split3",
    ]
    (compat,) = plan.by_role("compat")
    assert compat.needs == () and compat.checkpoint.startswith(str(tmp_path / "runs"))
    assert os.listdir(compat.checkpoint) == ["state.bin"]  # copied, not read
    run_uninterrupted(judge, plan)
    finish(judge, compat, range(4, 7))
    (verdict,) = compat_verdicts(judge)
    assert verdict.status == "passed" and not verdict.primary
    assert verdict.why.startswith("the checkpoint was written 20")


def test_a_golden_checkpoint_that_loads_differently_fails_naming_the_code_that_wrote_it(tmp_path):
    write_golden(tmp_path, golden_checkpoint=True)
    judge, plan = judge_for(tmp_path, target(tmp_path), golden_checkpoint=True)
    run_uninterrupted(judge, plan)
    (resumed,) = plan.by_role("resumed")
    finish(judge, resumed, range(4, 7))
    (compat,) = plan.by_role("compat")
    finish(judge, compat, range(4, 7), loss=lambda step, rank: step)
    (verdict,) = compat_verdicts(judge)
    assert verdict.failed and verdict.first_difference() == "step 4, rank 0, 'loss'"
    text = format_outcome(judge.conclude(), "kept")
    assert text.startswith(
        "checkpoint compatibility, split 3: the current code resumed from the golden's "
        "checkpoint (the checkpoint was written 20"
    )
    assert f"on {ENV.key}" in text
    assert "  [- golden]        2.0" in text and "  [+ resumed]       4" in text


def test_a_golden_without_the_checkpoint_of_a_split_says_so(tmp_path):
    write_golden(tmp_path)
    judge, plan = judge_for(tmp_path, target(tmp_path), golden_checkpoint=True)
    assert not plan.by_role("compat")
    run_uninterrupted(judge, plan)
    (verdict,) = compat_verdicts(judge)
    assert verdict.failed and verdict.why == (
        "the golden holds no checkpoint at split 3 (it has: none); run with "
        "--resume-equiv-update-golden"
    )


def test_golden_only_runs_one_launch_per_split_and_the_summary_says_so(tmp_path):
    write_golden(tmp_path, golden_checkpoint=True, split=[2, 4])
    only = GoldenTarget(GoldenStore(str(tmp_path / "goldens")), TEST, ENV, only=True)
    judge, plan = judge_for(tmp_path, only, golden_checkpoint=True, split=[2, 4])
    assert [p.name for p in plan.launches] == ["golden-resumed-split2", "golden-resumed-split4"]
    for launch in plan.launches:
        finish(judge, launch, range(launch.split + 1, 7))
    outcome = judge.conclude()
    assert outcome.equal and [v.check for v in outcome.verdicts] == ["compat", "compat"]
    run = RunRecord([], verdicts=outcome.checks)
    record = TestRecord(TEST, "passed", "passed", 6, [2, 4], 1, "cpu", 0.0, [run])
    assert format_golden_summary([record], [], False) == [
        f"{TEST}: golden-only: checkpoint compatibility, split 2 passed",
        f"{TEST}: golden-only: checkpoint compatibility, split 4 passed",
    ]


def test_golden_only_runs_the_whole_test_when_the_golden_has_no_checkpoint(tmp_path):
    write_golden(tmp_path)
    only = GoldenTarget(GoldenStore(str(tmp_path / "goldens")), TEST, ENV, only=True)
    _, plan = judge_for(tmp_path, only)
    assert [p.name for p in plan.started] == ["uninterrupted", "resumed-split3"]
    assert any(c.kind == "golden" for c in plan.checks)


class SessionConfig:
    """What ResumeEquivSession reads of a pytest config (a controller: no workerinput)."""

    inipath = None

    def __init__(self, cli, args=()):
        self._cli = cli
        self.args = list(args)
        self.rootpath = "/r"

    def getini(self, name):
        return None

    def getoption(self, name, default=None):
        return self._cli.get(name, default)


def test_the_controller_lists_unused_goldens_from_what_its_workers_collected(tmp_path):
    from pytest_resume_equiv.session import WORKER_COLLECTED, ResumeEquivSession

    write_golden(tmp_path)  # TEST's golden
    store = GoldenStore(str(tmp_path / "goldens"))
    gone = "tests/test_t.py::test_gone"
    written_from = tmp_path / "update" / "runs" / "uninterrupted"
    store.write(GoldenMeta(gone, ENV, 1, 6), str(written_from))
    cli = {"resume_equiv_golden": str(tmp_path / "goldens")}
    session = ResumeEquivSession(SessionConfig(cli))
    session.worker_done({WORKER_COLLECTED: [TEST]})
    session.worker_done({WORKER_COLLECTED: []})
    session.finish()
    assert session.unused == [gone] and store.load(gone, ENV.key) is not None  # listed only
    updating = ResumeEquivSession(SessionConfig({**cli, "resume_equiv_update_golden": True}))
    updating.worker_done({WORKER_COLLECTED: [TEST]})
    updating.finish()
    assert updating.unused == [gone] and store.load(gone, ENV.key) is None  # removed
    assert store.load(TEST, ENV.key) is not None
    store.write(GoldenMeta(gone, ENV, 1, 6), str(written_from))
    narrowed = ResumeEquivSession(
        SessionConfig({**cli, "resume_equiv_update_golden": True}, ["/r/tests/test_t.py::x"])
    )
    narrowed.worker_done({WORKER_COLLECTED: [TEST]})
    narrowed.finish()
    assert narrowed.unused == []  # a node id narrowed the file: nothing is unused
    assert store.load(gone, ENV.key) is not None


def test_a_golden_that_differs_asks_for_the_control_and_is_judged_within_its_noise(tmp_path):
    write_golden(tmp_path)
    judge, plan = judge_for(tmp_path, target(tmp_path))
    judge.scheduler.added.clear()
    run_uninterrupted(judge, plan, loss=lambda step, rank: step / 2 * (1 + 1e-7))
    assert golden_verdict(judge).failed
    assert judge.scheduler.added == ["uninterrupted-control"]
    (resumed,) = plan.by_role("resumed")
    finish(judge, resumed, range(4, 7), loss=lambda step, rank: step / 2 * (1 + 1e-7))
    (control,) = plan.by_role("control")
    finish(judge, control, range(1, 7), loss=lambda step, rank: step / 2 * (1 - 1e-7))
    verdict = golden_verdict(judge)
    assert verdict.status == "passed", verdict.why
    assert "within 4x the measured noise" in verdict.why


def test_a_stored_checkpoint_is_copied_only_into_the_tests_own_run_directory(tmp_path):
    from pytest_resume_equiv.plan import RunRequest

    write_golden(tmp_path, golden_checkpoint=True)
    outside = str(tmp_path / "users-checkpoints" / "step_{split}")
    with pytest.raises(ResumeEquivError, match=r"is not under \{run_dir\}"):
        plan_for(
            tmp_path / "runs",
            train,
            golden=target(tmp_path),
            request=RunRequest(train, checkpoint=outside),
            nproc=1,
            golden_checkpoint=True,
        )
    assert not (tmp_path / "users-checkpoints").exists()
