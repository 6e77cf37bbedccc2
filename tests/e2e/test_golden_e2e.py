"""The golden store end to end: pytest sessions in subprocesses launching real ranks on CPU.
The update flow (a missing golden fails, an update run writes it, a normal run passes), a
change that moves both runs alike (caught only by the golden), unused goldens."""

import pytest
from helpers import CPU

TRAINER = """
import os

import torch

import pytest_resume_equiv as req


def train(ctx):
    torch.manual_seed(0)
    weight = torch.ones(3) * float(os.environ.get("INIT", "1"))
    torch.manual_seed(10)
    start = 1
    if ctx.resuming:
        state = torch.load(os.path.join(ctx.checkpoint, "state.pt"), weights_only=True)
        weight, start = state["weight"], state["step"] + 1
        torch.set_rng_state(state["rng"])
    for step in range(start, ctx.steps + 1):
        weight = weight * 0.9 + torch.randn(3) * 0.01
        req.record(step, loss=float(weight.sum()))
        if ctx.should_save(step):
            os.makedirs(ctx.checkpoint_for(step), exist_ok=True)
            torch.save({"weight": weight, "step": step, "rng": torch.get_rng_state()},
                       os.path.join(ctx.checkpoint_for(step), "state.pt"))
"""

TEST = """
from pytest_resume_equiv import resume_equivalent
from golden_trainer import train

@resume_equivalent(steps=4, split=2, nproc=1, rng_mutation=False, env={{"INIT": "{init}"}})
def test_golden(resume_equiv):
    resume_equiv.run(train)
"""


@pytest.mark.long(60)
def test_the_update_flow_and_a_change_that_moves_both_runs(pytester):
    pytester.makepyfile(golden_trainer=TRAINER, test_g=TEST.format(init="1"))
    store = pytester.path / "goldens"
    golden = ("--resume-equiv-golden", str(store))

    missing = pytester.runpytest_subprocess(*CPU, *golden)
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(
        [
            "*golden trajectory: no golden for cpu-ws1-torch*-sig2 (have: none); run with "
            "--resume-equiv-update-golden*"
        ]
    )

    update = pytester.runpytest_subprocess(*CPU, *golden, "--resume-equiv-update-golden")
    update.assert_outcomes(passed=1)
    update.stdout.fnmatch_lines(
        [
            "*- resume-equiv goldens in *goldens -*",
            "test_g.py::test_golden: wrote the golden cpu-ws1-torch*-sig2 to *goldens/test_g.py__test_golden/cpu-ws1-*",
        ]
    )
    (key,) = [p.name for p in (store / "test_g.py__test_golden").iterdir() if p.is_dir()]
    assert (store / "test_g.py__test_golden" / key / "signatures" / "rank-0.jsonl").is_file()

    same = pytester.runpytest_subprocess(*CPU, *golden, "-v")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*golden trajectory equal to the golden over 4 steps*"])

    pytester.makepyfile(test_g=TEST.format(init="2"))  # both runs move alike
    moved = pytester.runpytest_subprocess(*CPU, *golden)
    moved.assert_outcomes(failed=1)
    moved.stdout.fnmatch_lines(
        [
            "*golden trajectory: the uninterrupted run differs from the golden written *",
            "*golden trajectory: first divergence at step 1, rank 0, key 'loss'*",
            "*- golden]        2.68*",
            "*+ uninterrupted] 5.38*",
        ]
    )
    moved.stdout.fnmatch_lines(["split 2: equal on its one rank over 2 steps"])  # resume fine

    pytester.makepyfile(test_g=TEST.format(init="1").replace("def test_golden", "def test_renamed"))
    unused = pytester.runpytest_subprocess(*CPU, *golden, "--resume-equiv-update-golden")
    unused.assert_outcomes(passed=1)
    unused.stdout.fnmatch_lines(
        [
            "unused goldens (1, no collected test uses them), removed (--resume-equiv-update-golden):",
            "  test_g.py::test_golden",
        ]
    )
    assert not (store / "test_g.py__test_golden").exists()
    assert (store / "test_g.py__test_renamed" / key).is_dir()
