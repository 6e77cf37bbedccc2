"""A trainer shaped like VeOmni's Wan2.1 DiT trainer, tested as it is (tests/zoo/dit_train.py,
issue 40): list batches (a tensor per sample, latents of different frame counts), a condition
component that draws each micro-batch's noise and timesteps from its own generator before the
forward, gradient accumulation, a StatefulDataLoader, FSDP2 and DCP with a per-rank extra-state
file. The correct trainer passes (its CPU RNG differs after the resume only by the base seed its
loader's iterator draws: latent); each planted bug is named by its own cause with its Fix; a
latent-only difference passes with its warning; both runs record the list batches.

One pytest session; every case but the unsaved generator (a bug of the save) shares one
uninterrupted launch: the bug is given to the resumed launch alone."""

import re
import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of

TRAIN = Path(__file__).parent.parent / "zoo" / "dit_train.py"

TESTS = """
from pytest_resume_equiv import resume_equivalent

COMMAND = ["dit_train.py", "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"]


def run(resume_equiv, bug="none", command=COMMAND):
    resume_equiv.run(
        command,
        checkpoint="{run_dir}/checkpoints/global_step_{split}",
        resume_args=["--resume-from={checkpoint}", f"--bug={bug}"],
    )


@resume_equivalent(steps=6, split=3, nproc=2)
def test_dit_resumes(resume_equiv):
    run(resume_equiv)


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_dit_generator_not_saved(resume_equiv):
    # a bug of the save: the uninterrupted launch runs it too
    run(resume_equiv, command=[*COMMAND, "--bug=generator-not-saved"])


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_dit_scheduler_not_restored(resume_equiv):
    run(resume_equiv, "scheduler-not-restored")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_dit_optimizer_not_loaded(resume_equiv):
    run(resume_equiv, "optimizer-not-loaded")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_dit_latent_rng(resume_equiv):
    run(resume_equiv, "latent-rng")
"""

PRELOAD = "torch.distributed.checkpoint,torch.distributed.fsdp,torchdata.stateful_dataloader"
"""What every rank of the trainer imports beyond the fork server's own (seconds per rank)."""


def _generator_site() -> str:
    """Where the condition component makes its generator: the name the report gives it."""
    lines = TRAIN.read_text().splitlines()
    (line,) = [i for i, text in enumerate(lines, 1) if "self.generator = torch.Generator(" in text]
    return f"the generator created at dit_train.py:{line}"


@pytest.mark.long(90)
def test_a_dit_trainer_shaped_like_veomni_is_tested_as_it_is(pytester):
    shutil.copy(TRAIN, pytester.path / TRAIN.name)
    pytester.makepyfile(test_dit=TESTS)
    result = pytester.runpytest_subprocess(
        *CPU, f"--resume-equiv-preload={PRELOAD}", "-rA", "-p", "no:cacheprovider"
    )
    text = result.stdout.str()
    print(text)
    assert "INTERNALERROR" not in text
    problems = []  # every case is checked: the report lists all that are wrong at once

    def expect(ok: bool, problem: str) -> None:
        if not ok:
            problems.append(problem)

    found = re.findall(r"^(PASSED|FAILED) test_dit\.py::(\w+)", text, re.M)
    outcomes = {name: outcome for outcome, name in found}
    verdicts = {
        "test_dit_resumes": "PASSED",
        "test_dit_generator_not_saved": "FAILED",
        "test_dit_scheduler_not_restored": "FAILED",
        "test_dit_optimizer_not_loaded": "FAILED",
        "test_dit_latent_rng": "PASSED",
    }
    for name, verdict in verdicts.items():
        expect(outcomes.get(name) == verdict, f"{name}: {outcomes.get(name)}, not {verdict}")

    # both runs record every micro-batch's list batch, by content, on every rank
    for line in text.splitlines():
        if "auto:batch" in line or "auto:data" in line:
            expect("run only" not in line, f"a list batch recorded on one side: {line}")
    automatic = "recorded automatically: auto:batch, auto:data, auto:loss"
    objects = "watch:lr_scheduler, watch:model, watch:optimizer"
    for name in verdicts:
        expect(f"{automatic}, {objects}" in section_of(text, name), f"{name}: not all recorded")

    # the correct trainer passes: its CPU RNG differs after the resume only by the base seed
    # its loader's iterator drew (nothing after the resume draws from it): a latent warning
    passed = section_of(text, "test_dit_resumes")
    expect("split 3: equal on all 2 ranks over 3 steps" in passed, "test_dit_resumes: not equal")
    expect(
        "teeth check passed" in passed or "changed the recorded values" in passed,
        "test_dit_resumes: the teeth check did not bite",
    )
    warned = " ".join(line for line in passed.splitlines() if "a latent difference" in line)
    expect("rng:cpu" in warned and "rng:python" not in warned, f"test_dit_resumes: {warned!r}")

    # Python's random restored, then drawn once more by nothing compared: passes, warned
    latent = section_of(text, "test_dit_latent_rng")
    expect("split 3: equal on all 2 ranks over 3 steps" in latent, "test_dit_latent_rng: not equal")
    warned = " ".join(line for line in latent.splitlines() if "a latent difference" in line)
    expect("rng:python" in warned, "test_dit_latent_rng: no latent warning for rng:python")

    expected = {
        "test_dit_generator_not_saved": (
            "never restored",
            [_generator_site(), "was never restored", "generator.set_state()"],
        ),
        "test_dit_scheduler_not_restored": (
            "scheduler never restored",
            ["the LR scheduler 'lr_scheduler' was never restored", "warmup restarts"],
        ),
        # DCP loads tensors in place, unlogged: what shows is the state missing at the point
        "test_dit_optimizer_not_loaded": (
            "optimizer state missing",
            ["the optimizer state of 'optimizer' is missing", "optimizer.state_dict()"],
        ),
    }
    for name, (bug_class, words) in expected.items():
        section = section_of(text, name)
        causes = [line.strip() for line in section.splitlines() if "likely cause (" in line]
        if not causes:
            problems.append(f"{name}: no likely cause")
            continue
        # the leading cause is the bug itself, with its fix: not a latent stream, not the data
        lead = causes[0]
        expect(f"likely cause ({bug_class}): " in lead, f"{name}: leads with {lead[:200]!r}")
        for word in words:
            expect(word in lead, f"{name}: no {word!r} in the leading cause")
        expect(lead.count("Fix:") == 1, f"{name}: the leading cause has no one Fix:")
        expect(
            "computed differently after an exact resume" not in section,
            f"{name}: computed differently",
        )
    assert not problems, "\n".join(problems)
