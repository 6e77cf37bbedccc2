"""Every CPU-reproducible class of ../shared/BUGS.md is caught, and the report names its cause.

Each case runs tests/zoo/bugzoo.py (one trainer, one switch per bug) under the plugin in a
pytest subprocess with real torchrun ranks on CPU/gloo. Class 2 (device RNG) needs an
accelerator and is not here.
"""

import shutil
from pathlib import Path

import pytest
from helpers import CPU

ZOO = Path(__file__).with_name("zoo") / "bugzoo.py"

CASES = [
    # (BUGS.md class, BUG switch, marker arguments, trainer, what the report must say)
    (
        "01-cpu-rng",
        "cpu_rng",
        "nproc=1",
        "train",
        [
            "likely cause (cpu RNG)",
            "the CPU RNG (torch default generator) differs: it was not restored",
        ],
    ),
    (
        "03-rng-collapsed",
        "rng_collapse",
        "nproc=2",
        "train",
        ["rank 1, step 4: after the resume, rank 1's cpu RNG state equals rank 0's"],
    ),
    (
        "04-owned-generator",
        "owned_generator",
        "nproc=1",
        "train",
        [
            "the generator created at bugzoo.py:",
            "differs while the CPU and device generators match: its state was not restored",
        ],
    ),
    ("05-numpy", "numpy", "nproc=1", "train", ["numpy's global RNG differs: it was not restored"]),
    (
        "05-python-random",
        "python_random",
        "nproc=1",
        "train",
        ["Python's random module differs: it was not restored"],
    ),
    (
        "06-dataloader-workers",
        "workers",
        "nproc=1",
        "train",
        ["sample content differs (batch) while the sample ids (ids)", "dataloader worker seeds"],
    ),
    (
        "07-sampler-epoch",
        "sampler_epoch",
        "nproc=1, steps=7, split=5",
        "train",
        ["sample ids differ (ids)", "sampler epoch or permutation"],
    ),
    (
        "08-mid-epoch-skip",
        "skip",
        "nproc=1",
        "train",
        ["sample ids differ (ids)", "number of batches skipped"],
    ),
    (
        "09-epoch-boundary",
        "epoch_boundary",
        "nproc=1, split=4",
        "train",
        ["the resumed run recorded no steps (expected 5-6)", "exhausted at an epoch boundary"],
    ),
    (
        "10-lr-scheduler-missing",
        "lr_missing",
        "nproc=1",
        "train",
        ["likely cause (LR scheduler missing)", "the LR scheduler was not restored"],
    ),
    (
        "11-lr-scheduler-off-by-one",
        "lr_off_by_one",
        "nproc=1",
        "train",
        ["the learning rate is shifted by one step"],
    ),
    (
        "12-optimizer-state",
        "optimizer",
        "nproc=1",
        "train",
        ["likely cause (optimizer state)", "moments or step counts were not saved"],
    ),
    ("13-loss-scaler", "scaler", "nproc=1", "train", ["the watched object 'scaler' differs"]),
    ("14-ema", "ema", "nproc=1", "train", ["the watched object 'ema' differs"]),
    (
        "15-train-eval-flags",
        "eval_flags",
        "nproc=1",
        "train",
        ["module train/eval flags differ (1 in eval mode in one run only)"],
    ),
    (
        "16-buffers",
        "buffers",
        "nproc=1",
        "train",
        ["likely cause (buffers): rank 0, step 4: buffer 1.", "BatchNorm running statistics"],
    ),
    (
        "17-gradient-accumulation",
        "grad_accum",
        "nproc=1",
        "train",
        ["gradient-accumulation micro-step counter"],
    ),
    (
        "18-step-off-by-one",
        "step_off_by_one",
        "nproc=1",
        "train",
        ["re-executed step 3, the step the checkpoint was saved after", "off by one"],
    ),
    (
        "19-master-weights",
        "master_weights",
        "nproc=1",
        "train_master_weights",
        ["master weights) differ only at rounding level", "fp32 master weights were rebuilt"],
    ),
    (
        "20-torn-checkpoint",
        "torn",
        "nproc=1",
        "train",
        ["the loaded weights are not the weights at save time"],
    ),
    (
        "21-rank-local-state",
        "rank_local",
        "nproc=2",
        "train",
        ["random streams match; only rank 1 differs: per-rank state", "saved from rank 0 only"],
    ),
    ("22-re-executed-steps", "restart", "nproc=1", "train", ["re-executed steps 1-3"]),
]


@pytest.fixture
def zoo(pytester):
    shutil.copy(ZOO, pytester.path / "bugzoo.py")
    return pytester


def _marker(args: str) -> str:
    given = dict(part.strip().split("=") for part in args.split(","))
    given.setdefault("steps", "6")
    given.setdefault("split", "3")
    return ", ".join(f"{k}={v}" for k, v in given.items())


@pytest.mark.parametrize(
    ("bug", "args", "trainer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bug_class_is_caught_and_named(zoo, bug, args, trainer, expected):
    zoo.makepyfile(
        test_bug=f"""
        from pytest_resume_equiv import resume_equivalent
        from bugzoo import {trainer}

        @resume_equivalent({_marker(args)}, env={{"BUG": "{bug}"}})
        def test_bug(resume_equiv):
            resume_equiv.run({trainer})
        """
    )
    result = zoo.runpytest_subprocess(*CPU)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    verdict = [
        line.strip() for line in result.stdout.lines if "likely cause" in line or "split" in line
    ]
    for phrase in expected:
        assert phrase in text, f"report lacks {phrase!r}; it says: {verdict}"
    assert "not deterministic" not in text
    assert "Traceback" not in text  # a clean verdict, not a crashed rank


def test_correct_trainers_pass(zoo):
    """No false alarms: 1 and 2 ranks, a resume at an epoch boundary, several splits."""
    zoo.makepyfile(
        test_controls="""
        from pytest_resume_equiv import resume_equivalent
        from bugzoo import train, train_master_weights

        @resume_equivalent(steps=6, split=3, nproc=1)
        def test_one_rank(resume_equiv):
            resume_equiv.run(train)

        @resume_equivalent(steps=6, split=3, nproc=2)
        def test_two_ranks(resume_equiv):
            resume_equiv.run(train)

        @resume_equivalent(steps=6, split=4, nproc=1)
        def test_epoch_boundary(resume_equiv):
            resume_equiv.run(train)

        @resume_equivalent(steps=7, split=[2, 3, 5], nproc=1, rng_mutation=False)
        def test_several_splits(resume_equiv):
            outcome = resume_equiv.run(train)
            assert [v.split for v in outcome.verdicts] == [2, 3, 5]

        @resume_equivalent(steps=5, split=2, nproc=1)
        def test_master_weights(resume_equiv):
            resume_equiv.run(train_master_weights)
        """
    )
    result = zoo.runpytest_subprocess(*CPU)
    result.assert_outcomes(passed=5)
