"""Baselines shared across the tests of a session, and across pytest-xdist workers."""

import json

import pytest
from helpers import CPU, processes_mentioning

COUNTING = """
import os

from trainers import _loop


def _count(ctx):
    # Every uninterrupted launch leaves one line: how many baselines really ran.
    if ctx.phase == "uninterrupted" and ctx.rank == 0:
        with open(os.environ["BASELINE_COUNTER"], "a") as f:
            f.write(f"{ctx.steps}\\n")


def train_counting(ctx):
    _count(ctx)
    _loop(ctx)


def train_counting_forgets_rng(ctx):
    _count(ctx)
    _loop(ctx, restore_rng=ctx.phase == "uninterrupted")
"""


@pytest.fixture
def counting(trainers, monkeypatch, tmp_path):
    trainers.makepyfile(counting=COUNTING)
    counter = tmp_path / "baselines-run.txt"
    monkeypatch.setenv("BASELINE_COUNTER", str(counter))
    return trainers, counter


@pytest.mark.long(45)
def test_resume_tests_share_baselines_across_two_xdist_workers(counting):
    """pytest -n 2 with 6 resume tests at once: the five with the same launch (one of them
    with another timeout) run it once (one worker runs it, the other waits and reuses it),
    the one with other steps gets its own; no run directory is shared by accident, no port collides, nothing is left running,
    the JSON report is one file, and passing tests remove the shared baselines."""
    pytest.importorskip("xdist")
    pytester, counter = counting
    pytester.makepyfile(
        test_share="""
        import pytest
        from pytest_resume_equiv import resume_equivalent
        from counting import train_counting

        def launch(resume_equiv):
            outcome = resume_equiv.run(train_counting)
            for launch in outcome.launches:
                print("RUN_DIR", launch.spec.name, launch.spec.run_dir)

        @pytest.mark.parametrize("n", range(4))
        @resume_equivalent(steps=3, split=1, nproc=1, rng_mutation=False)
        def test_many(resume_equiv, n):
            launch(resume_equiv)

        @resume_equivalent(steps=3, split=1, nproc=1, rng_mutation=False, timeout=300)
        def test_longer_timeout(resume_equiv):
            launch(resume_equiv)  # the timeout bounds the launch: it is still the same launch

        @resume_equivalent(steps=4, split=1, nproc=1, rng_mutation=False)
        def test_other_steps(resume_equiv):
            launch(resume_equiv)
        """
    )
    result = pytester.runpytest_subprocess(
        *CPU, "-n", "2", "-rP", "-v", "--resume-equiv-report=r.json"
    )
    result.assert_outcomes(passed=6)
    # -v: the workers' tests say what they proved too, reuse included
    result.stdout.fnmatch_lines(
        ["*resume-equiv: test_share.py::test_* passed: launches uninterrupted (reused: run for *"]
    )
    assert sorted(counter.read_text().split()) == ["3", "4"]  # 2 uninterrupted launches ran
    assert "(reused: run for test_share.py::test_many[" in result.stdout.str()
    dirs = [line.split()[1:] for line in result.stdout.lines if line.startswith("RUN_DIR ")]
    resumed = {path for name, path in dirs if name.startswith("resumed")}
    baselines = {path for name, path in dirs if name == "uninterrupted"}
    assert len(dirs) == 12 and len(resumed) == 6 and len(baselines) == 2
    assert processes_mentioning(str(pytester.path)) == []
    # one JSON report for the whole session, the workers' tests merged by the controller
    report = json.loads((pytester.path / "r.json").read_text())
    assert [t["test"] for t in report["tests"]] == [
        "test_share.py::test_longer_timeout",
        *(f"test_share.py::test_many[{n}]" for n in range(4)),
        "test_share.py::test_other_steps",
    ]
    assert sum(t["reused_launches"] for t in report["tests"]) == 4
    assert not list(pytester.path.glob("r.json.*"))
    assert list((pytester.path / ".resume-equiv" / "runs").iterdir()) == []  # all passed


@pytest.mark.long(25)
def test_a_failed_test_keeps_the_shared_baseline_it_used(counting):
    pytester, counter = counting
    pytester.makepyfile(
        test_share="""
        from pytest_resume_equiv import resume_equivalent
        from counting import train_counting_forgets_rng

        @resume_equivalent(steps=5, split=3, nproc=1, rng_mutation=False)
        def test_bug(resume_equiv):
            resume_equiv.run(train_counting_forgets_rng)
        """
    )
    result = pytester.runpytest_subprocess(*CPU)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.stdout.lines if "uninterrupted: " in x)
    kept = pytester.path.joinpath(line.split("uninterrupted: ", 1)[1].strip())
    assert kept.parent.name == "shared"
    assert kept.parent.parent.parent == pytester.path / ".resume-equiv" / "runs"
    assert (kept / "signatures" / "rank-0.jsonl").exists() and (kept / "KEEP").exists()
