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
def test_batch_skipped(resume_equiv):
    run(resume_equiv, "skip-batch")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_batch_repeated(resume_equiv):
    run(resume_equiv, "repeat-batch")


@resume_equivalent(steps=6, split=3, nproc=2, resume_nproc=1, rng_mutation=False, auto=True)
def test_batch_skipped_on_another_topology(resume_equiv):
    run(resume_equiv, "skip-batch")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_epoch_replayed(resume_equiv):
    run(resume_equiv, "replay-epoch")


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_augmented_with_a_stream_not_restored(resume_equiv):
    run(resume_equiv, command=[*COMMAND, "--augment"])


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=True)
def test_checkpoint_of_another_step(resume_equiv):
    run(resume_equiv, "wrong-checkpoint", [*COMMAND[:2], "--save-at=3,5", COMMAND[3]])


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False, auto=False)
def test_auto_off_sees_nothing(resume_equiv):
    run(resume_equiv, "no-optimizer-state")


NOISED = ["noised_train.py", "--max-steps={steps}", "--save-at={splits}", "--out={run_dir}"]


@resume_equivalent(steps=6, split=3, nproc=1, auto=True)
def test_noised_trainer_resumes(resume_equiv):
    run(resume_equiv, command=NOISED)


@resume_equivalent(steps=6, split=3, nproc=1, rng_mutation=False, auto=True)
def test_noised_batch_skipped(resume_equiv):
    run(resume_equiv, "skip-batch", NOISED)
"""


@pytest.mark.long(120)
def test_a_trainer_with_no_plugin_line_is_tested_as_it_is(pytester):
    for trainer in ("plain_train.py", "noised_train.py"):
        shutil.copy(ZOO / trainer, pytester.path / trainer)
    pytester.makepyfile(test_plain=TESTS)
    result = pytester.runpytest_subprocess(*CPU, "-rA", "-p", "no:cacheprovider")
    text = result.stdout.str()
    print(text)
    assert "INTERNALERROR" not in text
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("failed") == 11, outcomes
    passed = section_of(text, "test_plain_trainer_resumes")
    assert "split 3: equal on all 2 ranks over 3 steps" in passed
    assert "teeth check passed" in passed or "changed the recorded values" in passed
    automatic = "auto:data, auto:loss, watch:lr_scheduler, watch:model, watch:optimizer"
    assert f"recorded automatically: {automatic}" in text
    # noise added to the batches in the loop: the DataLoader's batches are the samples
    noised = section_of(text, "test_noised_trainer_resumes")
    assert "split 3: equal on its one rank over 3 steps" in noised
    assert "recorded automatically: auto:batch, auto:data, auto:loss" in noised
    expected = {
        "test_forgotten_optimizer_state": ["likely cause (optimizer never restored)"],
        "test_forgotten_scheduler": ["likely cause (scheduler never restored)"],
        # data-order bugs, named from the inputs' content alone (no sample ids recorded)
        "test_data_restarted": [
            "consumed at steps 4-6 the samples of steps 1-3, in order",
            "likely cause (data order)",
            "started the data over from an earlier place",
        ],
        "test_batch_skipped": [
            "the batch of step 4 was never consumed: step 4 consumed the batch of step 5, and "
            "each later step the batch of the step after its own",
            "likely cause (data order)",
            "one batch was lost at the resume",
        ],
        "test_batch_repeated": [
            "step 4 consumed the batch of step 3 again, and each later step the batch of the "
            "step before its own",
            "likely cause (data order)",
        ],
        # over the global batch, resumed on 1 rank of a run on 2: the same words by content
        "test_batch_skipped_on_another_topology": [
            "the batch of step 4 was never consumed",
            "likely cause (data order)",
        ],
        "test_epoch_replayed": [
            "recorded steps 7-9, past steps=6",
            "likely cause (re-executed steps): the resumed run re-executed steps 1-3",
        ],
        # the augmentation's stream is the cause; the inputs' new content is its effect
        "test_augmented_with_a_stream_not_restored": [
            "likely cause (",
            "Python's random module",
            "found nowhere in the uninterrupted run",
        ],
        "test_checkpoint_of_another_step": ["the checkpoint loaded is of step 5, not step 3"],
        "test_auto_off_sees_nothing": ["never recorded"],
        # every input is new (other samples, the same noise): the loader's batches name the skip
        "test_noised_batch_skipped": [
            "data (the batches the DataLoader yielded, by content) after the resume",
            "likely cause (data order): step 4: the batches the DataLoader yielded (auto:batch",
            "the batch of step 4 was never consumed: step 4 consumed the batch of step 5",
            "one batch was lost at the resume",
        ],
    }
    for name, phrases in expected.items():
        section = section_of(text, name)
        for phrase in phrases:
            assert phrase in section, f"{name}: no {phrase!r}"
        # a cause is named only from evidence that separates it: never the fallback that
        # says the resume was exact while the inputs differ, never samples lost for new content
        assert "computed differently after an exact resume" not in section, name
        causes = [line for line in section.splitlines() if "likely cause (" in line]
        assert all(line.count("Fix:") == 1 for line in causes), (name, causes)
    assert "unaudited input" not in section_of(text, "test_noised_batch_skipped")
    augmented = section_of(text, "test_augmented_with_a_stream_not_restored")
    assert "never seen" not in augmented and "seen twice" not in augmented
