"""End to end: a pytest session in a subprocess launches real torchrun ranks on CPU/gloo."""

import os
import re

import pytest
from helpers import CPU, check_rng_report

from pytest_resume_equiv.launch.devices import DeviceUnavailable, select_device


def test_correct_trainer_passes(trainers):
    """Two ranks, with the teeth check; the zoo's controls pass with 1 and 2 ranks too."""
    trainers.makepyfile(
        test_ok="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train

        @resume_equivalent(steps=6, split=3, nproc=2)
        def test_two_ranks(resume_equiv):
            outcome = resume_equiv.run(train)
            assert [v.comparison.compared_steps for v in outcome.verdicts] == [3]
            assert outcome.teeth.status == "passed"
        """
    )
    result = trainers.runpytest_subprocess(*CPU, "-v")
    result.assert_outcomes(passed=1)
    # -v: after the test, one line says what it proved
    result.stdout.fnmatch_lines(
        [
            "*resume-equiv: test_ok.py::test_two_ranks passed: launches uninterrupted, "
            "resumed-split3, teeth-split3; split 3 equal over 3 steps; teeth check passed "
            "(mutating every RNG stream changed the recorded values)"
        ]
    )
    # passing tests remove their run directories (--resume-equiv-keep=failed), and the
    # session's folder goes with them
    assert list((trainers.path / ".resume-equiv" / "runs").iterdir()) == []
    assert "kept in" not in result.stdout.str()


def test_cpu_rng_not_restored_fails_at_step_4(trainers):
    trainers.makepyfile(
        test_rng="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train_forgets_cpu_rng

        @resume_equivalent(steps=6, split=3, nproc=2)
        def test_rng(resume_equiv):
            resume_equiv.run(train_forgets_cpu_rng)
        """
    )
    result = trainers.runpytest_subprocess(
        *CPU, "--resume-equiv-report=report.json", "-v", "--junitxml=junit.xml"
    )
    result.assert_outcomes(failed=1)
    # -v: a line per launch event; the end of the session: the summary table
    result.stdout.fnmatch_lines(
        [
            "*resume-equiv: uninterrupted (2 ranks): running, step 0/6 recorded on every rank*",
            "*resume-equiv: uninterrupted (2 ranks): ok, step 6/6 recorded on every rank*",
            "*resume-equiv: resumed-split3 (2 ranks): ok, step 6/6 recorded*",
            "*resume-equiv: test_rng.py::test_rng failed: launches uninterrupted, resumed-split3, "
            "uninterrupted-control; teeth check cancelled (the resume from step 3 diverged); "
            "determinism control matched",
            "*= resume equivalence =*",
            "test * ranks * splits * launches * wall * verdict * first divergence",
            "test_rng.py::test_rng * 2 * 3 * 3 * failed * split 3: step 4, rank 0, 'loss'",
        ]
    )
    # the failure text holds one plot; on CI pytest repeats the whole text in the short summary
    (plot_path,) = {x[len("plot: ") :] for x in result.stdout.lines if x.startswith("plot: ")}
    with open(plot_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"  # uninterrupted vs resumed, split marked
    junit = (trainers.path / "junit.xml").read_text()
    assert '<property name="resume_equiv_verdict" value="failed"' in junit
    assert '<property name="resume_equiv_launches" value="3"' in junit
    assert (
        '<property name="resume_equiv_likely_cause" value="split 3: never restored: ranks 0-1:'
        in junit
    )
    assert '<property name="resume_equiv_teeth_check" value="cancelled: the resume' in junit
    assert '<property name="resume_equiv_determinism_control" value="matched"' in junit
    result.stdout.fnmatch_lines(
        [
            "*resumed training is not equivalent to the uninterrupted run*",
            "*split 3: first divergence at step 4, rank 0, key 'loss': float differs*",
            # automatic recording is on by default: the inputs drawn from the unrestored
            # stream (auto:data), the loss given to backward() and the model it found differ too
            "*keys that differ at step 4: rank 0: loss, weight, auto:data, auto:loss, rng:cpu, "
            "watch:model.params; rank 1: loss, weight, auto:data, auto:loss, rng:cpu, "
            "watch:model.params",
            "*likely cause (never restored): ranks 0-1: the CPU RNG (torch's default generator) was never restored (no set_rng_state call for it after the checkpoint was read)*torch.get_rng_state() / torch.set_rng_state()",
            "recorded automatically: auto:data, auto:loss, watch:model",
            "*run directories (kept: --resume-equiv-keep=failed):*",
            "*rerun the resumed launch by hand:*",
            "*python* -m torch.distributed.run *--nproc-per-node=2*",
        ]
    )
    text = result.stdout.str()
    assert "  [- uninterrupted] " in text and "  [+ resumed]       " in text
    assert "Traceback" not in text
    kept = list(trainers.path.glob(".resume-equiv/runs/*/*/resumed-split3/signatures/rank-1.jsonl"))
    assert len(kept) == 1

    check_rng_report(trainers.path / "report.json")


def test_split_list_runs_one_uninterrupted_and_two_resumed_launches(trainers):
    trainers.makepyfile(
        test_splits="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train

        @resume_equivalent(steps=6, split=[2, 4], nproc=2, rng_mutation=False)
        def test_splits(resume_equiv):
            outcome = resume_equiv.run(train)
            print("LAUNCHES", [r.spec.name for r in outcome.launches])
        """
    )
    result = trainers.runpytest_subprocess(*CPU, "--resume-equiv-keep=all", "-s")
    result.assert_outcomes(passed=1)
    assert "LAUNCHES ['uninterrupted', 'resumed-split2', 'resumed-split4']" in result.stdout.str()
    (root,) = trainers.path.glob(".resume-equiv/runs/*/test_splits*")
    assert sorted(p.name for p in root.iterdir()) == ["resumed-split2", "resumed-split4"]
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    assert oct(root.parent.stat().st_mode & 0o777) == "0o700"  # the session's folder
    result.stdout.fnmatch_lines([f"resume-equiv: run directories kept in {root.parent} (*"])
    # the one uninterrupted launch lives where other tests with the same launch can reuse it
    shared = root.parent / "shared"
    (baseline,) = [p for p in shared.iterdir() if p.is_dir()]
    assert (baseline / "checkpoints" / "step_2").is_dir()
    assert (baseline / "checkpoints" / "step_4").is_dir()
    assert oct(shared.stat().st_mode & 0o777) == "0o700"


DRIFTS = """
import os

import pytest_resume_equiv as req
from pytest_resume_equiv import resume_equivalent


def train(ctx, drift):
    for step in range(ctx.split + 1 if ctx.resuming else 1, ctx.steps + 1):
        req.record(step, loss=1.0 / step + (drift if ctx.resuming else 0.0))
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)


def drifts(ctx):
    train(ctx, 1e-9)


def exact(ctx):
    train(ctx, 0.0)


@resume_equivalent(steps=3, split=1, nproc=1, rng_mutation=False, auto=False)
def test_drifts(resume_equiv):
    resume_equiv.run(drifts)


@resume_equivalent(steps=3, split=1, nproc=1, rng_mutation=False, auto=False)
def test_exact(resume_equiv):
    resume_equiv.run(exact)
"""


def test_a_failed_tests_run_directories_outlast_later_sessions(pytester):
    """Issue 40: pytest deletes its older base temporary directories at every session's end,
    so kept run directories live in <rootdir>/.resume-equiv/runs/<session>/, which a later
    session (here one that even wipes the same --basetemp) leaves alone."""
    pytester.makepyfile(test_drift=DRIFTS)
    basetemp = f"--basetemp={pytester.path / 'bt'}"  # pytest empties it at every start
    first = pytester.runpytest_subprocess(*CPU, basetemp, "-k", "test_drifts")
    first.assert_outcomes(failed=1, deselected=1)
    runs = pytester.path / ".resume-equiv" / "runs"
    (folder,) = runs.iterdir()
    first.stdout.fnmatch_lines(
        [
            f"resume-equiv: run directories of failed tests kept in {folder} (the last 5 "
            f"sessions are kept; delete {runs} to clean)"
        ]
    )
    text = first.stdout.str()
    rerun = text.split("rerun the resumed launch by hand:", 1)[1].split("\n\n", 1)[0]
    (resumed,) = folder.glob("test_drifts-*/resumed-split1")
    assert str(folder) in rerun, rerun
    assert (resumed / "signatures" / "rank-0.jsonl").exists()
    assert (pytester.path / ".resume-equiv" / ".gitignore").read_text().endswith("*\n")
    second = pytester.runpytest_subprocess(*CPU, basetemp, "-k", "test_exact")
    second.assert_outcomes(passed=1, deselected=1)
    assert "kept in" not in second.stdout.str()
    assert list(runs.iterdir()) == [folder]  # the passing session's folder went
    assert (resumed / "signatures" / "rank-0.jsonl").exists()


def test_bad_marker_arguments_error_that_test_only(pytester):
    pytester.makepyfile(
        test_bad="""
        import pytest
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=6, split=3, nprocs=2)
        def test_unknown_keyword(resume_equiv):
            pass

        @resume_equivalent(steps=4, split=4)
        def test_split_too_large(resume_equiv):
            pass

        @pytest.mark.resume_equivalent(steps="six", split=3)
        def test_bad_type(resume_equiv):
            pass

        def test_unrelated():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*CPU)
    result.assert_outcomes(passed=1, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*@resume_equivalent: unknown keyword 'nprocs' (did you mean 'nproc'?); valid keywords: steps, split, nproc, nnodes, timeout, tolerance, env, rng_mutation, interrupt, ignore, resume_nproc, resume_nnodes, chain, noise, golden_checkpoint, crash_points, crash_refusal, crash_saves, crash_mode, crash_grace, auto",
            "*@resume_equivalent: invalid split=4: every split must be an int with 1 <= split < steps=4",
            "*@resume_equivalent: invalid steps='six': must be an int >= 2",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


def _has_accelerator() -> bool:
    try:
        select_device("auto", 1)
    except DeviceUnavailable:
        return False
    return True


@pytest.mark.skipif(_has_accelerator(), reason="this machine has an accelerator: auto would use it")
def test_auto_skips_without_accelerator_and_require_device_fails(pytester):
    pytester.makepyfile(
        test_auto="""
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=4, split=2)
        def test_needs_device(resume_equiv):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_subprocess("-p", "resume_equiv", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "resume-equiv: device=auto -> no accelerator, resume tests skip (default), timeout=600s (default), keep=failed (default)",
            "*no accelerator found (looked for cuda, npu (torch_npu), xpu); pass --resume-equiv-device=cpu*",
        ]
    )
    strict = pytester.runpytest_subprocess("-p", "resume_equiv", "--resume-equiv-require-device")
    strict.assert_outcomes(errors=1)
    strict.stdout.fnmatch_lines(["*no accelerator found*(--resume-equiv-require-device is set)"])

    cuda = pytester.runpytest_subprocess("-p", "resume_equiv", "--resume-equiv-device=cuda", "-rs")
    cuda.assert_outcomes(skipped=1)
    cuda.stdout.fnmatch_lines(["*needs 2 cuda device(s), found 0*"])


def test_the_plugin_leaves_torch_unimported_in_a_session_without_resume_tests(pytester):
    """The plugin autoloads in every pytest session: a header that imported torch and asked
    torch.cuda.is_available() would poison fork for the user's own tests (and cost seconds)."""
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_nothing_imported_torch():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "resume_equiv")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["resume-equiv: device=auto -> no accelerator, resume tests skip*"])


def test_a_resumed_launch_larger_than_the_devices_is_checked_at_setup(pytester):
    pytester.makepyfile(
        test_bigger="""
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=4, split=2, nproc=1, resume_nproc=4, interrupt="stop")
        def test_needs_four(resume_equiv):
            raise AssertionError("must not run")
        """
    )
    cuda = pytester.runpytest_subprocess("-p", "resume_equiv", "--resume-equiv-device=cuda", "-rs")
    cuda.assert_outcomes(skipped=1)
    cuda.stdout.fnmatch_lines(
        [
            "*needs 4 cuda device(s) (its resumed launches: resume_nproc=4 x resume_nnodes=1 on this host), found 0*"
        ]
    )


def _failure_section(text: str, test: str) -> str:
    """The part of pytest's report about one failed test: from its `___ test ___` header to
    the next header (a session holding several tests reports each on its own)."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if re.fullmatch(rf"_+ {test} _+", line))
    end = next(
        (
            n
            for n in range(start + 1, len(lines))
            if re.match(r"(_{3,} \S+ _{3,}|={3,} )", lines[n])
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


def test_launch_failures_are_clear_and_the_torchrun_fixture_runs_every_target(trainers):
    """One session (each pytest start costs seconds) of five tests with launches of their
    own: a missing checkpoint, a rank that raises, a rank killed by a signal (each with its
    own clear failure), the torchrun fixture's scripts, modules and functions, and a passing
    test's private run directory, removed when it passed."""
    trainers.makepyfile(
        test_ckpt="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train_never_saves

        @resume_equivalent(steps=4, split=2, nproc=1)
        def test_ckpt(resume_equiv):
            resume_equiv.run(train_never_saves)
        """,
        test_crash="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import train_rank1_raises

        @resume_equivalent(steps=4, split=2, nproc=2)
        def test_crash(resume_equiv):
            resume_equiv.run(train_rank1_raises)
        """,
        test_killed="""
        from trainers import rank1_killed

        def test_killed(torchrun):
            torchrun(rank1_killed, nproc=3)
        """,
        hello_script="""
        import os
        print("script on rank", os.environ["RANK"])
        """,
        test_launch="""
        from trainers import hello

        def test_launch_modes(torchrun):
            for command in (["hello_script.py"], ["-m", "hello_script"]):
                result = torchrun(command, nproc=2)
                assert result.ok and [r.status for r in result.ranks] == ["ok", "ok"]
                with open(result.rank_log(1, "stdout")) as f:
                    assert f.read() == "script on rank 1\\n"
            result = torchrun(hello, nproc=2)
            with open(result.rank_log(0, "stdout")) as f:
                assert f.read() == "hello from rank 0 of 2\\n"
            sigs = torchrun.signatures(result)
            assert [sigs[r].steps[0][1]["rank"] for r in (0, 1)] == [0, 1]
        """,
        test_private="""
        import os, stat
        from trainers import hello

        def test_private(torchrun):
            result = torchrun(hello, nproc=1)
            root = os.path.dirname(result.spec.run_dir)
            with open("private-root.txt", "w") as f:
                f.write(root)
            assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        """,
    )
    result = trainers.runpytest_subprocess(*CPU)
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(
        [
            "FAILED test_ckpt.py::test_ckpt*",
            "FAILED test_crash.py::test_crash*",
            "FAILED test_killed.py::test_killed*",
        ]
    )
    text = result.stdout.str()

    # a missing checkpoint: what was expected where, and no resumed launch started
    ckpt = _failure_section(text, "test_ckpt")
    pytest.LineMatcher(ckpt.splitlines()).fnmatch_lines(
        [
            "*the uninterrupted run did not save a checkpoint at */.resume-equiv/runs/*/shared/*/checkpoints/step_2 (from checkpoint='{run_dir}/checkpoints/step_{split}', split=2); the trainer must save there after step 2*"
        ]
    )
    assert "resumed-split2" not in ckpt

    # a rank that raises: its traceback, the rank that failed first
    crash = _failure_section(text, "test_crash")
    pytest.LineMatcher(crash.splitlines()).fnmatch_lines(
        [
            "*the uninterrupted launch (uninterrupted) failed (2 ranks, *",
            "*rank 1: ValueError: boom on rank 1*",  # the rank that failed comes first
            "*rank 0: stopped by torchrun (SIGTERM) after rank 1 failed*",
            "*--- last lines of rank 1 stderr (*/logs/rank-1.stderr) ---*",
            "*Traceback (most recent call last):*",
            "*ValueError: boom on rank 1*",
            "*rerun by hand: cd * && env *",
        ]
    )

    # a rank killed by a signal is a failure, with every rank's last lines
    killed = _failure_section(text, "test_killed")
    pytest.LineMatcher(killed.splitlines()).fnmatch_lines(
        [
            "*the torchrun launch (launch-1) failed*",
            "*rank 1: killed by SIGKILL*",
            "*rank 0: stopped by torchrun (SIGTERM) after rank 1 failed*",
            "*rank 2: stopped by torchrun (SIGTERM) after rank 1 failed*",
            "*--- last lines of rank 1 stdout (*/logs/rank-1.stdout) ---*",
            "*rank 1 says hello*",
            "*--- last lines of rank 0 stdout (*/logs/rank-0.stdout) ---*",
            "*rank 0 says hello*",
            "*--- the other ranks' last lines ---*",
            "*rank 2 (none): rank 2 says hello*",
        ]
    )

    # run directories are private (0700, checked inside the test) and removed on pass
    root = (trainers.path / "private-root.txt").read_text()
    assert root.startswith(str(trainers.path))
    assert not os.path.exists(root)


def test_invalid_session_option_fails_marked_tests_only(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_RESUME_EQUIV_TIMEOUT", "soon")
    pytester.makepyfile(
        test_opts="""
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=4, split=2)
        def test_marked(resume_equiv):
            pass

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*CPU)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "resume-equiv: invalid settings, resume tests will fail: invalid timeout 'soon' from environment variable PYTEST_RESUME_EQUIV_TIMEOUT: expected a positive number of seconds",
            "*pytest-resume-equiv: invalid timeout 'soon' from environment variable PYTEST_RESUME_EQUIV_TIMEOUT*",
        ]
    )


def test_plugin_loads_with_autoload_disabled_and_can_be_disabled(pytester, monkeypatch):
    pytester.makepyfile(
        test_fixture="""
        def test_uses_fixture(resume_equiv):
            pass
        """
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    loaded = pytester.runpytest_subprocess(
        "-p", "resume_equiv", "--resume-equiv-device=cpu", "--resume-equiv-timeout=42"
    )
    loaded.assert_outcomes(errors=1)
    loaded.stdout.fnmatch_lines(
        [
            "resume-equiv: device=cpu (command line --resume-equiv-device), timeout=42s (command line --resume-equiv-timeout), keep=failed (default)",
            "*the resume_equiv fixture needs @resume_equivalent(steps=..., split=...) or "
            "@equivalent(steps=..., variants=...) on the test*",
        ]
    )
    markers = pytester.runpytest_subprocess("-p", "resume_equiv", "--markers")
    markers.stdout.fnmatch_lines(
        [
            "@pytest.mark.resume_equivalent(steps, split, nproc=2, nnodes=1, *",
            "@pytest.mark.equivalent(steps, baseline=None, variants, nproc=2, *",
        ]
    )
    helptext = pytester.runpytest_subprocess("-p", "resume_equiv", "--help")
    helptext.stdout.fnmatch_lines(
        ["resume equivalence (pytest-resume-equiv):", "*--resume-equiv-device*"]
    )

    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    disabled = pytester.runpytest_subprocess("-p", "no:resume_equiv")
    disabled.assert_outcomes(errors=1)
    disabled.stdout.fnmatch_lines(["*fixture 'resume_equiv' not found*"])
    assert "resume-equiv:" not in disabled.stdout.str()


@pytest.mark.long(30)
def test_a_signature_without_teeth_fails_the_teeth_check(trainers):
    trainers.makepyfile(
        test_teeth="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import no_randomness, toothless

        @resume_equivalent(steps=5, split=2, nproc=1)
        def test_teeth(resume_equiv):
            resume_equiv.run(toothless)

        @resume_equivalent(steps=5, split=2, nproc=1, rng_mutation=False)
        def test_teeth_off(resume_equiv):
            outcome = resume_equiv.run(toothless)
            assert [r.spec.name for r in outcome.launches] == ["uninterrupted", "resumed-split2"]

        @resume_equivalent(steps=5, split=2, nproc=1)
        def test_nothing_random_needs_no_teeth(resume_equiv):
            outcome = resume_equiv.run(no_randomness)
            assert [r.spec.name for r in outcome.launches] == ["uninterrupted", "resumed-split2"]
            assert outcome.teeth.status == "skipped"
            assert "no audited RNG stream advances" in outcome.teeth.why
        """
    )
    result = trainers.runpytest_subprocess(*CPU, "-v")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*this test has no teeth: every RNG stream was mutated right after step 3 of a resumed run (launch teeth-split2), and the recorded values at steps 4-5 still matched*",
        ]
    )
    assert "keep dropout on" in result.stdout.str()
    # -v says why each passing test has no teeth check; the table says why the other failed
    result.stdout.fnmatch_lines(
        [
            "*resume-equiv: test_teeth.py::test_teeth_off passed: launches uninterrupted*; "
            "teeth check off (rng_mutation=False from marker @resume_equivalent(rng_mutation=...))",
            "*resume-equiv: test_teeth.py::test_nothing_random_needs_no_teeth passed: *teeth check "
            "skipped (no audited RNG stream advances after the split*",
        ],
        consecutive=False,
    )
    lines = result.stdout.lines
    table = lines[next(i for i, x in enumerate(lines) if " resume equivalence " in x) :]
    row = next(x for x in table if x.startswith("test_teeth.py::test_teeth "))
    assert row.endswith(
        "failed   no teeth: the recorded values matched with every RNG stream mutated"
    )


def test_nondeterministic_training_is_not_blamed_on_the_resume(trainers):
    trainers.makepyfile(
        test_nondet="""
        from pytest_resume_equiv import resume_equivalent
        from trainers import nondeterministic

        @resume_equivalent(steps=4, split=2, nproc=1)
        def test_nondet(resume_equiv):
            resume_equiv.run(nondeterministic)
        """
    )
    result = trainers.runpytest_subprocess(*CPU)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*training is not deterministic even without a resume: a second uninterrupted run differs from the first (first at step 1, rank 0, key 'value'*the resume is not to blame.",
            "*torch.use_deterministic_algorithms(True)*",
            "test_nondet.py::test_nondet * failed * not deterministic without a resume: step 1, rank 0, 'value'",
        ]
    )
    assert "likely cause" not in result.stdout.str()


SAVES_AFTER_ITS_STEP = """
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int)
parser.add_argument("--out")
parser.add_argument("--resume-from", default=None)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # keeps no step counter
start = 1
if args.resume_from:
    # the bug: the newest save is loaded (a "latest" lookup), not the one asked for
    newest = os.path.join(os.path.dirname(args.resume_from), "step_5")
    state = torch.load(os.path.join(newest, f"rank-{rank}.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    start = int(args.resume_from.rsplit("_", 1)[1]) + 1
for step in range(start, args.max_steps + 1):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * step + rank))
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    if step in (3, 5) and not args.resume_from:  # saved right after its optimizer step
        folder = os.path.join(args.out, f"step_{step}")
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": model.state_dict()}, os.path.join(folder, f"rank-{rank}.pt"))
dist.destroy_process_group()
"""


def test_the_step_of_the_checkpoint_loaded_is_read_from_the_files_it_read(pytester):
    """A trainer with no plugin line and no step counter (plain SGD, no scheduler) saves right
    after its optimizer step and, resumed, loads the newest save instead of the split's: the
    files its load read were written after step 5 (not 4: the save belongs to the step just
    taken, though its automatic line is written at the next forward), and that is the
    finding, with automatic recording on by default."""
    pytester.makepyfile(train_sgd=SAVES_AFTER_ITS_STEP)
    pytester.makepyfile(
        test_newest="""
        from pytest_resume_equiv import resume_equivalent

        @resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
        def test_newest(resume_equiv):
            resume_equiv.run(
                ["train_sgd.py", "--max-steps={steps}", "--out={run_dir}"],
                checkpoint="{run_dir}/step_{split}",
                resume_args=["--resume-from={checkpoint}"],
            )
        """
    )
    result = pytester.runpytest_subprocess(*CPU, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "split 3: the checkpoint loaded is of step 5, not step 3 (rank 0, rank 1: the file "
            "read (rank-0.pt) was written after step 5); the resumed run went on as if from "
            "step 3.*",
        ]
    )
