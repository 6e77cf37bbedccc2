"""Every CPU-reproducible class of ../shared/BUGS.md is caught, and the report names its cause
and its fix, including the patterns that used to be misnamed (a flag that stops dropout looks
like an RNG bug; a stream restored and then drawn from looks not restored; ...).

tests/zoo/bugzoo.py, orderzoo.py and loaderzoo.py are trainers with a switch per bug and no
`record` line: the plugin records them automatically (a step is an optimizer step), bar the
calls that show what automatic recording cannot reach (bugzoo's EMA, which no optimizer holds,
and the sample ids of its worker-seed case, apart from their content). Each case is
a resume test of its own in a real pytest session (pytester subprocess) with real torchrun
ranks on CPU/gloo; the cases run in three sessions, one per xdist worker at a time. Inside a
session every test whose bug is on the load path shares the correct trainer's uninterrupted
launch, as tests in a user's suite do. Class 2 (device RNG) needs an accelerator.
"""

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import CPU, gate_contradictions, section_of

ZOO = Path(__file__).parent.parent / "zoo"
CURSOR = Path(__file__).parents[2] / "examples" / "data_loading" / "train_cursor.py"


def copy_scripts(dest: Path) -> None:
    """The zoo's trainers, and the example trainer that resumes on another number of ranks."""
    for script in [*ZOO.glob("*.py"), CURSOR]:
        shutil.copy(script, Path(dest) / script.name)


@dataclass(frozen=True)
class Case:
    name: str
    """The BUGS.md class number and a word: the test's name."""
    bug: str
    expected: tuple[str, ...]
    """Phrases the report must hold: the cause, and the fix."""
    group: str
    marker: str = "nproc=1"
    script: str = "bugzoo.py --trainer=train"
    every_launch: bool = False
    """A bug in training or on the save path: the uninterrupted launch has it too."""
    checkpoint: str = ""
    resume: str = ""
    """Resume arguments of a command-line trainer (its --bug is added to them)."""
    example: str = ""
    """The example test that runs this very case in the suite and checks these phrases (the
    zoo then leaves it to the bug catalogue, so the suite runs it once)."""


def zoo(name, bug, *expected, group="a", **kw):
    return Case(name, bug, expected, group, **kw)


ORDER = "orderzoo.py"
CHAIN = "nproc=1, split=[2, 4], chain=True"
CASES = [
    zoo(
        "01-cpu-rng",
        "cpu_rng",
        "likely cause (never restored)",
        "the CPU RNG (torch's default generator) was never restored",
        "Fix: save and restore it, torch.get_rng_state() / torch.set_rng_state()",
    ),
    zoo(
        "03-rng-collapsed",
        "rng_collapse",
        "likely cause (restored from another rank)",
        "rank 1: at the resume point rng:cpu equals rank 0's saved state",
        "Fix: save each rank's own state, keyed by its global rank",
        marker="nproc=2",
        group="b",
    ),
    zoo(
        "04-owned-generator",
        "owned_generator",
        "likely cause (never restored)",
        "the generator created at bugzoo.py:",
        "was never restored",
        "generator.get_state() / generator.set_state()",
    ),
    zoo(
        "05-numpy",
        "numpy",
        "numpy's global RNG was never restored",
        "np.random.get_state() / np.random.set_state()",
    ),
    zoo(
        "05-python-random",
        "python_random",
        "Python's random module was never restored",
        "random.getstate() / random.setstate()",
    ),
    zoo(
        "06-dataloader-workers",
        "workers",
        "likely cause (dataloader workers)",
        "sample content differs (auto:data) while the sample ids (ids)",
        "dataloader worker seeds",
        every_launch=True,  # the trainer records its sample ids (bugzoo.py says why)
    ),
    zoo(
        "07-sampler-epoch",
        "sampler_epoch",
        "likely cause (data order)",
        "samples never seen",
        "the loader's epoch or shuffling generator",
        marker="nproc=1, steps=7, split=5",
        group="b",
    ),
    zoo("08-mid-epoch-skip", "skip", "likely cause (data order)", "number of batches skipped"),
    zoo(
        "09-epoch-boundary",
        "epoch_boundary",
        "the resumed run recorded no steps (expected 5-6)",
        "exhausted at an epoch boundary",
        marker="nproc=1, split=4",
        group="b",
    ),
    zoo(
        "10-lr-scheduler-missing",
        "lr_missing",
        "likely cause (scheduler never restored)",
        "the LR scheduler 'lr_scheduler' was never restored",
        "warmup restarts",
        "Fix: save and load its state_dict()",
    ),
    zoo(
        "11-lr-scheduler-off-by-one",
        "lr_off_by_one",
        "likely cause (LR scheduler off by one)",
        "the LR scheduler 'lr_scheduler' is one step ahead at the resume point",
        "Fix: save the scheduler after its step; do not step it after load_state_dict",
    ),
    zoo(
        "12-optimizer-state",
        "optimizer",
        "likely cause (optimizer never restored)",
        "the optimizer 'optimizer' was never restored",
        "moments, step counts",
    ),
    zoo(
        "13-loss-scaler",
        "scaler",
        "likely cause (watched state)",
        "'grad_scaler' differs",
        "state_dict() after the step that ends at the split and load it back",
    ),
    zoo(
        "14-ema",
        "ema",
        "likely cause (module never restored)",
        "the module 'ema' was never restored",
    ),
    zoo(
        "15-train-eval-flags",
        "eval_flags",
        "likely cause (left in the wrong mode)",
        "2 in eval mode in the uninterrupted run only",
        every_launch=True,
    ),
    zoo(
        "15-left-in-eval-mode",
        "eval_after_load",
        "likely cause (left in the wrong mode)",
        "<root>, 0, 1, 2, 3, 4, 5 in eval mode in the resumed run only",
        "model.train() after loading",
    ),
    zoo(
        "16-buffers",
        "buffers",
        "likely cause (buffers)",
        "buffer 2.num_batches_tracked differs at the resume point",
        "BatchNorm running statistics",
    ),
    zoo(
        "17-gradient-accumulation",
        "grad_accum",
        "likely cause (gradient accumulation)",
        "gradient-accumulation micro-step counter",
    ),
    zoo(
        "18-step-off-by-one",
        "step_off_by_one",
        "re-executed step 3, the step the checkpoint was saved after",
        "off by one",
    ),
    zoo(
        "19-master-weights",
        "master_weights",
        "likely cause (restored at reduced precision)",
        "the optimizer's own copies of the parameters ('optimizer': master weights)",
        "Fix: save the fp32 master weights",
        script="bugzoo.py --trainer=train_master_weights",
        group="b",
    ),
    zoo(
        "20-torn-checkpoint",
        "torn",
        "likely cause (torn checkpoint)",
        "was not on disk when the uninterrupted run went on past step 3",
        "Fix: copy the state when the save starts",
        every_launch=True,
    ),
    zoo(
        "21-rank-local-state",
        "rank_local",
        "only rank 1 differs: per-rank state",
        "saved from rank 0 only",
        marker="nproc=2",
        group="b",
    ),
    zoo(
        "21-rank-local-generator",
        "rank_local_generator",
        "likely cause (restored from another rank)",
        "rank 1: at the resume point rng:generator bugzoo.py:",
        "equals rank 0's saved state",
        marker="nproc=2",
        group="b",
    ),
    zoo("22-re-executed-steps", "restart", "re-executed steps 1-3"),
    zoo(
        "24-rng-then-iterator",
        "rng_then_iterator",
        "likely cause (restored then advanced)",
        "was restored (torch.set_rng_state at orderzoo.py:",
        "and then advanced by 4 draws",
        "random_ at orderzoo.py:62, randn at orderzoo.py:55 (3 times)",
        # draws beside the iterator's seed (augmentation): restoring after them comes first
        "Fix: restore the stream after that code runs; otherwise give the DataLoader started",
        script=ORDER,
        group="c",
    ),
    zoo(
        "24-restore-after-fetch",
        "restore_after_fetch",
        "likely cause (restored too late)",
        "only after it had been drawn from (randn at orderzoo.py:",
        "Fix: restore the stream before that code runs",
        script=ORDER,
        group="c",
    ),
    zoo(
        "23-chained-stale-state",
        "chain_stale",
        "the chain broke at link 2 of 2 (resumed from step 4); link 1 matched",
        "a resume from the uninterrupted run's checkpoint at step 4 matches",
        "the resumed run saves a stale object (a state dict taken before the load)",
        marker=CHAIN,
        group="c",
    ),
    zoo(
        "25-per-process-skip-on-another-world-size",
        "per-process-skip",
        "data NOT equivalent (a bug, not numeric noise)",
        "never seen",
        "likely cause (data order): data not equivalent on 1 rank",
        "the resumed run started from an earlier place in the data",
        "skip it in global samples (steps x global batch), not per process",
        marker="nproc=2, resume_nproc=1, steps=8, split=5",
        script="train_cursor.py --max-steps={steps} --save-at={splits} --output-dir={run_dir}",
        resume="--resume-from={checkpoint}",
        group="c",
        example="test_other_world_size.py::test_per_process_skip_is_caught_on_another_world_size",
    ),
    zoo(
        "26-saved-but-never-applied",
        "never_applied",
        "likely cause (module never restored)",
        "the module 'ema' was never restored (no load_state_dict call restored it)",
        marker="nproc=1, steps=7, split=5",
        group="b",
    ),
    zoo(
        "27-persistent-worker-carry-over",
        "persistent_carry",
        "likely cause (skipped again)",
        "the resumed run matched through step 3, then consumed the samples of step 6 (auto:",
        "persistent dataloader worker",
        marker="nproc=1, steps=7, split=2",
        script="loaderzoo.py",
        group="c",
    ),
    zoo(
        "20-rolling-checkpoint",
        "rolling",
        "likely cause (restored from another step)",
        "was written again by the uninterrupted run after it saved it at step 3",
        "Fix: put {split} in the checkpoint path",
        script=ORDER,
        group="c",
        every_launch=True,
        checkpoint="{run_dir}/rolling",
    ),
]

CONTROLS = {
    # group: [(test name, marker arguments, script): correct trainers that must pass]
    "a": [("control_one_rank", "nproc=1", "bugzoo.py --trainer=train")],
    "b": [
        ("control_two_ranks", "nproc=2", "bugzoo.py --trainer=train"),
        ("control_epoch_boundary", "nproc=1, split=4", "bugzoo.py --trainer=train"),
        ("control_sampler_epoch", "nproc=1, steps=7, split=5", "bugzoo.py --trainer=train"),
        ("control_master_weights", "nproc=1", "bugzoo.py --trainer=train_master_weights"),
    ],
    "c": [
        ("control_iterator_before_restore", "nproc=1", ORDER),
        ("control_iterator_after_every_load_and_save", "nproc=1", f"{ORDER} --reiterate=yes"),
        ("control_eval_pass_before_the_save", "nproc=1", f"{ORDER} --eval-before-save=yes"),
        ("control_latent_stream_warns", "nproc=1", f"{ORDER} --bug=latent_rng"),
        ("control_persistent_worker", "nproc=1, steps=7, split=2", "loaderzoo.py"),
    ],
}
WARNED = {
    "control_latent_stream_warns": "split 3: rank 0: rng:cpu differ after the resume, but no "
    "compared step draws from them"
}


def _marker(args: str) -> str:
    given = dict(part.strip().split("=", 1) for part in re.split(r",\s*(?=\w+=)", args))
    given.setdefault("steps", "6")
    given.setdefault("split", "3")
    given.setdefault("rng_mutation", "False")  # a test of its own covers the teeth check
    return ", ".join(f"{k}={v}" for k, v in given.items())


def _test(name: str, marker: str, command: list, resume_args: list, checkpoint: str) -> list[str]:
    kwargs = f", checkpoint={checkpoint!r}" if checkpoint else ""
    return [
        "",
        f"@resume_equivalent({_marker(marker)})",
        f"def test_{name.replace('-', '_')}(resume_equiv):",
        f"    resume_equiv.run({command!r}, resume_args={resume_args!r}{kwargs})",
        "",
    ]


def zoo_cases(group: str, with_examples: bool = False) -> list[Case]:
    return [c for c in CASES if c.group == group and (with_examples or not c.example)]


def _test_module(group: str, with_examples: bool = False) -> str:
    lines = ["from pytest_resume_equiv import resume_equivalent", ""]
    for case in zoo_cases(group, with_examples):
        command, resume_args = case.script.split(), case.resume.split()
        (command if case.every_launch else resume_args).append(f"--bug={case.bug}")
        lines += _test(case.name, case.marker, command, resume_args, case.checkpoint)
    for name, marker, script in CONTROLS[group]:
        lines += _test(name, marker, script.split(), [], "")
    return "\n".join(lines)


def _problems(text: str, group: str) -> list[str]:
    problems = []
    for case in zoo_cases(group):
        name = "test_" + case.name.replace("-", "_")
        section = section_of(text, name)
        if f"FAILED test_bugs.py::{name}" not in text:
            problems.append(f"{case.name}: not caught (the test did not fail)")
            continue
        missing = [phrase for phrase in case.expected if phrase not in section]
        if missing:
            problems.append(f"{case.name}: report lacks {missing}; it says:\n{section[:2500]}")
        if "not deterministic" in section or "Traceback" in section:
            problems.append(f"{case.name}: not a clean resume verdict:\n{section[:1500]}")
    for name, _args, _script in CONTROLS[group]:
        if f"PASSED test_bugs.py::test_{name}" not in text:
            problems.append(
                f"{name}: a correct trainer did not pass:\n{section_of(text, 'test_' + name)}"
            )
        if name in WARNED and WARNED[name] not in text:
            problems.append(f"{name}: no warning {WARNED[name]!r}")
    return problems


@pytest.mark.long(150)
@pytest.mark.parametrize("group", sorted(CONTROLS))
def test_bug_classes_are_caught_and_named(pytester, group):
    copy_scripts(pytester.path)
    pytester.makepyfile(test_bugs=_test_module(group))
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        *CPU, "-rA", "-W", "always", f"--resume-equiv-report={report}"
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text
    # where the resume point held, no cause blames an audited object's save or restore
    assert not gate_contradictions(report), gate_contradictions(report)
    problems = _problems(text, group)
    assert not problems, "\n".join(problems)
