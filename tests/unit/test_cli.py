"""`python -m pytest_resume_equiv compare|show` on kept run directories."""

import json
import subprocess
import sys

import pytest

import pytest_resume_equiv as req
from pytest_resume_equiv.__main__ import main
from pytest_resume_equiv.rank.context import current


@pytest.fixture
def runs(in_rank, tmp_path):
    """An uninterrupted run (steps 1-4) and two resumed ones from split 2: equal, diverged."""

    def write(phase, run_dir, steps, wrong_at=None):
        in_rank(phase=phase, run_dir=run_dir, split=2, steps=4)
        for step in steps:
            req.record(step, loss=step * 0.25 + (1.0 if step == wrong_at else 0.0))
        current().close()

    base, same, other = tmp_path / "base", tmp_path / "same", tmp_path / "other"
    write("uninterrupted", base, [1, 2, 3, 4])
    write("resumed", same, [3, 4])
    write("resumed", other, [3, 4], wrong_at=4)
    return str(base), str(same), str(other)


def test_compare_equal_runs_exits_0(runs, capsys):
    base, same, _ = runs
    assert main(["compare", base, same]) == 0
    assert "split 2: equal on its one rank over 2 steps" in capsys.readouterr().out


def test_compare_diverged_runs_exits_1_with_the_report(runs, capsys):
    base, _, other = runs
    assert main(["compare", base, other]) == 1
    out = capsys.readouterr().out
    assert "split 2: first divergence at step 4, rank 0, key 'loss': float differs" in out
    assert "[- uninterrupted] 1.0" in out and "[+ resumed]       2.0" in out
    assert "likely cause" in out


def test_bad_input_exits_2(runs, tmp_path, capsys):
    base, _, other = runs
    assert main(["compare", base, str(tmp_path / "nowhere")]) == 2
    assert "no signatures/ directory" in capsys.readouterr().err
    (tmp_path / "other" / "signatures" / "rank-0.jsonl").write_text('{"format": "x"}\n')
    assert main(["compare", base, other]) == 2
    assert "is not a pytest-resume-equiv/signature header" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["compare", base])
    assert info.value.code == 2


def test_show_prints_every_rank_and_step(runs, capsys):
    base, _, _ = runs
    assert main(["show", base, "--steps", "2-3"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 of 1: phase uninterrupted, split None, 4 steps recorded, complete" in out
    assert "  step 2: loss=0.5" in out and "  step 3: loss=0.75" in out
    assert "step 1:" not in out and "rng:" not in out
    assert main(["show", base, "--all", "--steps", "1"]) == 0
    assert "rng:python=" in capsys.readouterr().out


def test_runs_as_a_module(runs):
    base, _, other = runs
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_resume_equiv", "compare", base, other],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "first divergence at step 4" in proc.stdout


JUDGED = """
import os
import time

import torch

import pytest_resume_equiv as req
from pytest_resume_equiv import resume_equivalent


class Clock:
    '''Watched state that differs in every run: what ignore= is for.'''

    def state_dict(self):
        return {"now": time.time_ns()}


def train(ctx):
    req.watch(clock=Clock())
    for step in range(ctx.split + 1 if ctx.resuming else 1, ctx.steps + 1):
        # the resumed run computes the loss a little differently: what tolerance= is for
        req.record(step, loss=1.0 / step + (1e-9 if ctx.resuming else 0.0), n=torch.ones(2))
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)


@resume_equivalent(
    steps=4, split=2, nproc=1, rng_mutation=False,
    tolerance={"loss": (1e-6, 0.0)}, ignore=["watch:clock*"],
)
def test_judged(resume_equiv):
    resume_equiv.run(train)
"""


def test_compare_of_the_runs_a_test_kept_gives_that_tests_verdict(pytester, capsys):
    """The resumed run directory keeps the judgement (tolerance, ignore, split, steps), so
    the offline compare of the kept runs passes like the test did; overriding its tolerance
    or losing the judgement diverges, as a plain bitwise compare would."""
    pytester.makepyfile(test_judged=JUDGED)
    result = pytester.runpytest_subprocess(
        "-p", "resume_equiv", "--resume-equiv-device=cpu", "--resume-equiv-keep=all"
    )
    result.assert_outcomes(passed=1)
    (resumed,) = pytester.path.glob(".resume-equiv/runs/*/test_judged*/resumed-split2")
    judgement = json.loads((resumed / "judgement.json").read_text())
    base = judgement["runs"]["uninterrupted"]
    assert judgement["rules"] == {
        "steps": 4,
        "tolerance": {
            "name": "custom",
            "first": [["loss", 1e-6, 0.0]],
            "later": [["loss", 1e-6, 0.0]],
        },
        "ignore": ["watch:clock*"],
        "strict_latent": False,
    }
    assert main(["compare", base, str(resumed)]) == 0
    assert "split 2: equal on its one rank over 2 steps" in capsys.readouterr().out
    assert main(["compare", base, str(resumed), "--tolerance", "loss=0,0"]) == 1
    assert "key 'loss': float differs" in capsys.readouterr().out
    assert main(["compare", base, str(resumed), "--ignore", "nothing"]) == 1
    assert "key 'watch:clock.state'" in capsys.readouterr().out  # a tolerance compares it too
    (resumed / "judgement.json").unlink()  # a run directory without one: bitwise, every key
    assert main(["compare", base, str(resumed)]) == 1
    assert "key 'loss': float differs" in capsys.readouterr().out
