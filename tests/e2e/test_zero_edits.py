"""Zero edits: a plain torchrun trainer with its own save and resume, and no plugin line in
it, tested as it is: the correct one passes, its buggy copies are caught and named from what
the ranks recorded automatically (rank/auto.py)."""

import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of

ZOO = Path(__file__).parent.parent / "zoo"

TESTS = """
from pytest_resume_equiv import resume_equivalent

TRAIN = "plain_train.py"
COMMAND = [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--out={run_dir}"]


def run(resume_equiv, bug="none", command=COMMAND):
    resume_equiv.run(
        command,
        checkpoint="{run_dir}/step_{split}",
        resume_args=["--resume-from={checkpoint}", f"--bug={bug}"],
    )


@resume_equivalent(steps=6, split=3, nproc=2, auto=True)
def test_plain_trainer_resumes(resume_equiv):
    run(resume_equiv)


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_forgotten_optimizer_state(resume_equiv):
    run(resume_equiv, "no-optimizer-state")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_forgotten_scheduler(resume_equiv):
    run(resume_equiv, "no-scheduler")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_data_restarted(resume_equiv):
    run(resume_equiv, "data-restart")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_checkpoint_of_another_step(resume_equiv):
    run(resume_equiv, "wrong-checkpoint", [*COMMAND[:2], "--save-at=3,5", COMMAND[3]])


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=False)
def test_auto_off_sees_nothing(resume_equiv):
    run(resume_equiv, "no-optimizer-state")
"""


@pytest.mark.long(120)
def test_a_trainer_with_no_plugin_line_is_tested_as_it_is(pytester):
    shutil.copy(ZOO / "plain_train.py", pytester.path / "plain_train.py")
    pytester.makepyfile(test_plain=TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:cacheprovider")
    text = result.stdout.str()
    print(text)
    assert "INTERNALERROR" not in text
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed") == 5, outcomes
    passed = section_of(text, "test_plain_trainer_resumes")
    assert "split 3: equal on all 2 ranks over 3 steps" in passed
    assert "teeth check passed" in passed or "changed the recorded values" in passed
    automatic = "auto:data, auto:loss, watch:lr_scheduler, watch:model, watch:optimizer"
    assert f"recorded automatically: {automatic}" in text
    expected = {
        "test_forgotten_optimizer_state": "likely cause (optimizer never restored)",
        "test_forgotten_scheduler": "likely cause (scheduler never restored)",
        "test_data_restarted": "consumed at steps 4-6 the samples of steps 1-3, in order",
        "test_checkpoint_of_another_step": "the checkpoint loaded is of step 5, not step 3",
        "test_auto_off_sees_nothing": "never recorded",
    }
    for name, phrase in expected.items():
        assert phrase in section_of(text, name), f"{name}: no {phrase!r}"
