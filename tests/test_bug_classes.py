"""Every CPU-reproducible class of ../shared/BUGS.md is caught, and the report names its cause.

tests/zoo/bugzoo.py is one trainer with a switch per bug. Each case is a resume test of its
own in a real pytest session (pytester subprocess) with real torchrun ranks on CPU/gloo. The
cases run in two sessions, one per xdist worker: inside a session, every test whose bug is on
the load path shares the correct trainer's uninterrupted launch (and its determinism control),
as tests in a user's suite do. Class 2 (device RNG) needs an accelerator and is not here.
"""

import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of

ZOO = Path(__file__).with_name("zoo") / "bugzoo.py"

ON_EVERY_LAUNCH = {"eval_flags", "torn"}
"""Bugs in training or on the save path: the uninterrupted launch must have them too."""

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


GROUPS = {
    # one pytest session per group, balanced in launches; each holds some passing controls
    "a": [c for c in CASES if c[2] == "nproc=1" and c[3] == "train"],
    "b": [c for c in CASES if not (c[2] == "nproc=1" and c[3] == "train")],
}

CONTROLS = {
    # (group, test name, marker arguments, trainer): correct trainers that must pass
    "a": [("control_one_rank", "nproc=1", "train")],
    "b": [
        ("control_two_ranks", "nproc=2", "train"),
        ("control_epoch_boundary", "nproc=1, split=4", "train"),
        ("control_sampler_epoch", "nproc=1, steps=7, split=5", "train"),
        ("control_master_weights", "nproc=1", "train_master_weights"),
    ],
}


def _marker(args: str) -> str:
    given = dict(part.strip().split("=", 1) for part in re.split(r",\s*(?=\w+=)", args))
    given.setdefault("steps", "6")
    given.setdefault("split", "3")
    given.setdefault("rng_mutation", "False")  # a test of its own covers the teeth check
    return ", ".join(f"{k}={v}" for k, v in given.items())


def _test_module(group: str) -> str:
    lines = ["from pytest_resume_equiv import resume_equivalent", ""]
    cases = [(c[0], c[1], c[2], c[3]) for c in GROUPS[group]]
    cases += [(name, "none", args, trainer) for name, args, trainer in CONTROLS[group]]
    for case_id, bug, args, trainer in cases:
        name = "test_" + case_id.replace("-", "_")
        command = ["bugzoo.py", f"--trainer={trainer}"]
        resume_args = []
        if bug != "none":
            (command if bug in ON_EVERY_LAUNCH else resume_args).append(f"--bug={bug}")
        lines += [
            "",
            f"@resume_equivalent({_marker(args)})",
            f"def {name}(resume_equiv):",
            f"    resume_equiv.run({command!r}, resume_args={resume_args!r})",
            "",
        ]
    return "\n".join(lines)


@pytest.mark.long(150)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_bug_classes_are_caught_and_named(pytester, group):
    shutil.copy(ZOO, pytester.path / "bugzoo.py")
    pytester.makepyfile(test_bugs=_test_module(group))
    result = pytester.runpytest_subprocess(*CPU, "-rA")
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    problems = []
    for case_id, _bug, _args, _trainer, expected in GROUPS[group]:
        name = "test_" + case_id.replace("-", "_")
        section = section_of(text, name)
        if f"FAILED test_bugs.py::{name}" not in text:
            problems.append(f"{case_id}: not caught (the test did not fail)")
            continue
        missing = [phrase for phrase in expected if phrase not in section]
        if missing:
            problems.append(f"{case_id}: report lacks {missing}; it says:\n{section[:1500]}")
        if "not deterministic" in section or "Traceback" in section:
            problems.append(f"{case_id}: not a clean resume verdict:\n{section[:1500]}")
    for name, _args, _trainer in CONTROLS[group]:
        if f"PASSED test_bugs.py::test_{name}" not in text:
            problems.append(
                f"{name}: a correct trainer did not pass:\n{section_of(text, 'test_' + name)}"
            )
    assert not problems, "\n".join(problems)
