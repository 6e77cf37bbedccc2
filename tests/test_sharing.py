"""Baselines shared across the tests of a session, and across pytest-xdist workers."""

import pytest
from helpers import CPU

COUNTING = """
import os

from trainers import _loop


def train_counting(ctx):
    # Every uninterrupted launch leaves one line: how many baselines really ran.
    if ctx.phase == "baseline" and ctx.rank == 0:
        with open(os.environ["BASELINE_COUNTER"], "a") as f:
            f.write(f"{ctx.steps}\\n")
    _loop(ctx)


def train_counting_forgets_rng(ctx):
    if ctx.phase == "baseline" and ctx.rank == 0:
        with open(os.environ["BASELINE_COUNTER"], "a") as f:
            f.write(f"{ctx.steps}\\n")
    _loop(ctx, restore_rng=ctx.phase == "baseline")
"""


@pytest.fixture
def counting(trainers, monkeypatch, tmp_path):
    trainers.makepyfile(counting=COUNTING)
    counter = tmp_path / "baselines-run.txt"
    monkeypatch.setenv("BASELINE_COUNTER", str(counter))
    return trainers, counter


def test_tests_with_the_same_baseline_launch_share_it(counting):
    pytester, counter = counting
    pytester.makepyfile(
        test_share="""
        from pytest_resume_equiv import resume_equivalent
        from counting import train_counting

        @resume_equivalent(steps=5, split=3, nproc=1, rng_mutation=False)
        def test_a(resume_equiv):
            resume_equiv.run(train_counting)

        @resume_equivalent(steps=5, split=3, nproc=1, rng_mutation=False)
        def test_b(resume_equiv):
            resume_equiv.run(train_counting)

        @resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False)
        def test_other_steps(resume_equiv):
            resume_equiv.run(train_counting)
        """
    )
    result = pytester.runpytest_subprocess(*CPU, "-rP")
    result.assert_outcomes(passed=3)
    assert sorted(counter.read_text().split()) == ["5", "6"]  # test_b reused test_a's
    assert "(reused: run for test_share.py::test_a)" in result.stdout.str()
    # every test passed: --resume-equiv-keep=failed removes the shared baselines at the end
    assert not list(pytester.path.glob("runpytest-0/resume-equiv-baselines/*"))


def test_xdist_workers_run_a_shared_baseline_once(counting):
    pytest.importorskip("xdist")
    pytester, counter = counting
    pytester.makepyfile(
        test_share="""
        import pytest
        from pytest_resume_equiv import resume_equivalent
        from counting import train_counting

        @pytest.mark.parametrize("n", range(4))
        @resume_equivalent(steps=5, split=3, nproc=1, rng_mutation=False)
        def test_same(resume_equiv, n):
            resume_equiv.run(train_counting)
        """
    )
    result = pytester.runpytest_subprocess(*CPU, "-n", "2")
    result.assert_outcomes(passed=4)
    assert counter.read_text().split() == ["5"]
    assert not list(pytester.path.glob("runpytest-0/resume-equiv-baselines/*"))


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
    assert kept.parent.name == "resume-equiv-baselines"
    assert (kept / "signatures" / "rank-0.jsonl").exists() and (kept / "KEEP").exists()
