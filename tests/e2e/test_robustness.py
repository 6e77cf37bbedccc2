"""Ugly endings: hangs, crashes, shutdown aborts, Ctrl-C and SIGTERM, many xdist workers,
interrupted first launches and two nodes. Each becomes a clear verdict, keeps what it learned,
and leaves no process behind."""

import getpass
import json
import os
import signal
import time

import pytest
from helpers import CPU, interrupt_long_test, interrupt_once_started, processes_mentioning

from pytest_resume_equiv.launch.rank_exits import stuck_where
from pytest_resume_equiv.launch.stacks import (
    faulthandler_frames,
    py_spy_dump,
    py_spy_frames,
    summary,
)
from pytest_resume_equiv.rank.run_dir import log_path


@pytest.mark.long(30)
def test_hang_report_names_where_each_rank_was_stuck(trainers):
    trainers.makepyfile(
        test_hang="""
        from trainers import hangs_in_collective

        def test_hang(torchrun):
            torchrun(hangs_in_collective, nproc=2, timeout=25)
        """
    )
    result = trainers.runpytest_subprocess(*CPU)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the torchrun launch (launch-1) timed out after 25s and was killed*",
            "*rank 0: still running at the timeout (killed); stuck in *trainers.py:* in hangs_in_collective",
            "*rank 1: still running at the timeout (killed); stuck in *distributed_c10d.py:* in all_reduce, called from *trainers.py:* in hangs_in_collective",
        ]
    )
    assert processes_mentioning(str(trainers.path)) == []


def test_faulthandler_dump_is_read_back_as_frames(tmp_path):
    import faulthandler

    path = tmp_path / "rank-0.stderr"

    def inner_function():
        with open(path, "w") as f:
            f.write("some log line\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)

    inner_function()
    frames = faulthandler_frames(path.read_text())
    assert frames[0].func == "inner_function" and frames[0].file == __file__
    assert summary(frames).startswith("stuck in e2e/test_robustness.py:")  # two path parts


def test_py_spy_is_used_when_installed(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'echo "Process $3: python -m pytest_resume_equiv.rank.bootstrap"\n'
        'echo "Thread 0x1 (idle): \\"MainThread\\""\n'
        'echo "    recv (/venv/site-packages/torch/distributed/c10d.py:77)"\n'
        'echo "    train_step (/work/trainer.py:12)"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    text = py_spy_dump(os.getpid(), log_path(str(run_dir), 0, "pyspy"))
    assert text is not None and "MainThread" in text
    frames = py_spy_frames(text)
    assert [f.func for f in frames] == ["recv", "train_step"]
    # the launch's report prefers py-spy's view when it has one
    assert stuck_where(str(run_dir), 0) == (
        "stuck in distributed/c10d.py:77 in recv, called from work/trainer.py:12 in train_step"
    )


def test_py_spy_short_paths_still_lead_to_the_users_frame():
    """py-spy writes paths relative to sys.path, as it printed them for a rank stuck in a
    collective; the summary must still skip torch's frames to the user's."""
    text = (
        'Thread 4128 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n"
        "    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n"
        "    hangs_in_collective (trainers.py:142)\n"
        "    _run_target (pytest_resume_equiv/rank/bootstrap.py:148)\n"
        "    _run_code (<frozen runpy>:88)\n"
    )
    assert summary(py_spy_frames(text)) == (
        "stuck in distributed/distributed_c10d.py:3252 in all_reduce, "
        "called from trainers.py:142 in hangs_in_collective"
    )


@pytest.mark.long(30)
def test_a_shutdown_abort_after_the_work_is_a_warning_or_with_the_option_a_failure(trainers):
    trainers.makepyfile(
        test_abort="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train_aborts_at_exit

        @resume_equivalent(steps=4, split=2, nproc=2, rng_mutation=False)
        def test_resume(resume_equiv):
            outcome = resume_equiv.run(train_aborts_at_exit)
            assert outcome.resume_equal

        def test_torchrun(torchrun):
            torchrun(train_aborts_at_exit, nproc=1)
        """
    )
    result = trainers.runpytest_subprocess(*CPU, "-k", "test_resume")
    result.assert_outcomes(passed=1, warnings=1, deselected=1)
    # the rank that aborts first is named SIGABRT; its peer may abort too or be stopped by the
    # agent first (SIGTERM), a race CI saw, so the line is matched on any rank that aborted
    result.stdout.fnmatch_lines(
        [
            "*ResumeEquivWarning: * rank(s) died during interpreter shutdown after their work was "
            "done and recorded, so the comparison stands: uninterrupted rank *: "
            "finished its work and closed its signature, then died during interpreter shutdown "
            "(killed by SIGABRT)*",
        ]
    )
    strict = trainers.runpytest_subprocess(
        *CPU, "--resume-equiv-strict-shutdown", "-k", "test_torchrun"
    )
    strict.assert_outcomes(failed=1, deselected=1)
    strict.stdout.fnmatch_lines(
        [
            "*launch-1 rank 0: finished its work and closed its signature, then died during "
            "interpreter shutdown (killed by SIGABRT)*--resume-equiv-strict-shutdown makes this a "
            "failure*",
        ]
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_pytest_kills_every_launch_and_keeps_partial_runs(
    trainers, tmp_path, sig, monkeypatch
):
    # the temporary directories other pytest sessions of the user left (the last suite run's,
    # gigabytes): the interrupted pytest must not spend its exit deleting them (issue 39)
    root = tmp_path / "temproot"
    stale = [root / f"pytest-of-{getpass.getuser()}" / f"pytest-{n}" for n in (0, 9)]
    for path in stale:
        (path / "run").mkdir(parents=True)
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(root))
    # started as from a background job (a CI step, `cmd &`): SIGINT ignored, and inherited so
    # by the pytest the test starts, which must still stop at Ctrl-C as in a terminal (issue 39)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code, output = interrupt_long_test(trainers, tmp_path, sig)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert all(path.is_dir() for path in stale), output
    assert code == 2, output  # pytest: interrupted
    assert (
        "resume-equiv: interrupted; every launch was killed; partial run directories kept: "
        in output
    )
    # the summary counts the launch that was running when the test was interrupted
    row = next(x for x in output.splitlines() if x.startswith("test_long.py::test_long "))
    assert row.split()[1:4] == ["2", "2", "1"] and row.split()[-2:] == ["interrupted"] * 2, row
    kept = output.split("partial run directories kept: ", 1)[1].splitlines()[0].split(", ")
    assert all(os.path.isdir(path) for path in kept), kept
    assert any(os.path.exists(os.path.join(p, "logs", "rank-1.stderr")) for p in kept)
    time.sleep(1.5)  # ranks notice within a second if anything was missed
    assert processes_mentioning(str(trainers.path)) == []


def test_an_interrupt_after_a_divergence_keeps_what_was_found(trainers, tmp_path):
    """Ctrl-C while the determinism control runs, after the resume diverged: the summary and
    the interruption's lines say what was found, not "interrupted" alone."""
    trainers.makepyfile(
        test_found="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import forgets_cpu_rng_and_its_control_sleeps

        @resume_equivalent(steps=4, split=2, nproc=1, rng_mutation=False)
        def test_found(resume_equiv):
            resume_equiv.run(forgets_cpu_rng_and_its_control_sleeps)
        """
    )
    started = tmp_path / "started.txt"
    path = os.pathsep.join([str(trainers.path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "STARTED_FILE": str(started), "PYTHONPATH": path}
    args = [*CPU, "test_found.py"]
    code, output = interrupt_once_started(trainers.path, args, env, started, 1, signal.SIGINT)
    assert code == 2, output
    found = "interrupted after: split 2: step 3, rank 0, "
    assert f"resume-equiv: test_found.py::test_found: {found}" in output, output
    assert "'loss' (uninterrupted-control stopped before its end)" in output
    assert "resume-equiv: run directories of failed and interrupted tests kept in " in output
    row = next(x for x in output.splitlines() if x.startswith("test_found.py::test_found "))
    assert "interrupted" in row.split() and found[:40] in row, row
    assert processes_mentioning(str(trainers.path)) == []


@pytest.mark.long(40)
def test_interrupt_modes_stop_and_kill(trainers):
    trainers.makepyfile(
        test_modes="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train, train_saves_in_background

        @resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False, interrupt="stop")
        def test_stop(resume_equiv):
            outcome = resume_equiv.run(train)
            names = [r.spec.name for r in outcome.launches]
            assert sorted(names) == ["interrupted-split2", "resumed-split2", "uninterrupted"]

        @resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False, interrupt="kill")
        def test_kill(resume_equiv):
            outcome = resume_equiv.run(train)
            (first,) = [r for r in outcome.launches if r.spec.name == "interrupted-split2"]
            assert first.killed_after_step == 3

        @resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False, interrupt="kill")
        def test_kill_background_save(resume_equiv):
            resume_equiv.run(train_saves_in_background)
        """
    )
    result = trainers.runpytest_subprocess(*CPU, "-v", "-rP", "--resume-equiv-report=r.json")
    result.assert_outcomes(passed=2, failed=1)
    # the launch killed on purpose is not a failure, in every place that lists launches
    text = result.stdout.str()
    assert "resume-equiv: interrupted-split2 (1 rank): killed as planned, step " in text
    assert "interrupted-split2 (killed as planned)" in text  # the -v line after the test
    assert "interrupted-split2: 1 rank, " in text and "s, killed as planned, " in text
    assert "interrupted-split2: 1 rank," not in [x for x in result.stdout.lines if "FAILED" in x]
    report = json.loads((trainers.path / "r.json").read_text())
    kill = next(t for t in report["tests"] if t["test"].endswith("::test_kill"))
    (first,) = [x for x in kill["runs"][0]["launches"] if x["name"] == "interrupted-split2"]
    assert (first["status"], first["ok"], first["killed_after_step"]) == (
        "killed as planned",
        True,
        3,
    )
    result.stdout.fnmatch_lines(
        [
            "*the resumed launch (resumed-split2) failed*",
            "*rank 0: FileNotFoundError: *interrupted-split2/checkpoints/step_2/rank-0.pt*",
            "*likely cause: the checkpoint it loads was written by a launch SIGKILLed once every "
            "rank had recorded step 3 (interrupt='kill'): a checkpoint must be complete on disk "
            "before training goes on past it*",
        ]
    )


@pytest.mark.long(45)
def test_two_nodes_with_global_ranks_and_the_local_rank_bug(trainers):
    trainers.makepyfile(
        test_nodes="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train, train_state_by_local_rank

        @resume_equivalent(steps=4, split=2, nproc=1, nnodes=2, rng_mutation=False)
        def test_two_nodes(resume_equiv):
            outcome = resume_equiv.run(train)
            (verdict,) = outcome.verdicts
            assert verdict.comparison.world_size == 2

        @resume_equivalent(steps=4, split=2, nproc=1, nnodes=2, rng_mutation=False)
        def test_local_rank_state(resume_equiv):
            resume_equiv.run(train_state_by_local_rank)
        """
    )
    result = trainers.runpytest_subprocess(*CPU)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            # which rank's file survives is a race (the last writer wins); either is caught
            "*split 2: first divergence at step 3, rank *",
            "*likely cause (restored from another rank): rank ?: at the resume point rng:cpu "
            "equals rank ?'s saved state*keyed by its global rank*",
        ]
    )
