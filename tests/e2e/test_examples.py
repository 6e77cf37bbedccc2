"""The shipped examples run as a user runs them: their tests pass on CPU with gloo.

(The toy DiT examples run in tests/e2e/test_toy_wan.py, beside its resume bugs; the HF Trainer,
Lightning and accelerate examples in tests/e2e/test_integrations.py, beside their adapters.)
"""

import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of
from test_bug_classes import CASES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.long(45)
def test_minimal_example(pytester):
    shutil.copytree(EXAMPLES / "minimal", pytester.path / "minimal")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "minimal")
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "split 3: equal on all 2 ranks over 3 steps" in text
    assert "split 3: first divergence at step 4, rank 0, key 'auto:" in text
    assert "likely cause (never restored): ranks 0-1: the CPU RNG (torch's default" in text
    # the trainer has no plugin line: all of it was recorded automatically
    assert "recorded automatically: auto:data, auto:loss, watch:lr_scheduler, watch:model" in text
    assert "pytest_resume_equiv" not in (EXAMPLES / "minimal" / "train.py").read_text()


@pytest.mark.long(30)
def test_pictures_are_drawn_only_where_the_run_directories_stay(pytester, monkeypatch):
    """The caught bug's test passes, so its run directories go at teardown: its picture must
    not be drawn (drawn later into a removed folder, it failed with FileNotFoundError)."""
    from pytest_resume_equiv.report.drawer import Drawer

    handed = []
    monkeypatch.setattr(Drawer, "later", lambda self, picture: handed.append(picture.path))
    shutil.copytree(EXAMPLES / "minimal", pytester.path / "minimal")
    caught = (pytester.path / "minimal" / "test_minimal_caught_bug.py").read_text()
    failing = caught.replace("test_forgotten_cpu_rng_is_caught", "test_plainly_failing")
    failing = failing.replace("with pytest.raises(pytest.fail.Exception) as caught:", "if True:")
    (pytester.path / "minimal" / "test_plainly_failing.py").write_text(failing)
    result = pytester.runpytest_inprocess(*CPU, "minimal", "-k", "caught or plainly")
    result.assert_outcomes(passed=1, failed=1)
    assert len(handed) == 1 and "test_plainly_failing" in handed[0], handed


@pytest.mark.long(80)
def test_data_loading_examples(pytester):
    """A StatefulDataLoader trainer with two workers resumed mid-epoch 1 and in a chain, its
    twin that forgets the epoch, and a global-cursor trainer resumed 2 -> 1 and 1 -> 2, with
    its twin that skips per process. No trainer has a plugin line but the twin that forgets the
    epoch, run with `--watch-loader` (the loader watched, its sample ids recorded)."""
    pytest.importorskip("torchdata.stateful_dataloader")
    shutil.copytree(EXAMPLES / "data_loading", pytester.path / "data_loading")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "data_loading")
    result.assert_outcomes(passed=5)
    text = result.stdout.str()
    chain = section_of(text, "test_stateful_loader_resumes_again_and_again")
    for link in (
        "chain link 1 (resumed from step 2 of the uninterrupted run): equal",
        "chain link 2 (resumed from step 4, from the checkpoint chain link 1 saved): equal",
        "chain link 3 (resumed from step 6, from the checkpoint chain link 2 saved): equal",
    ):
        assert link in chain
    epoch = section_of(text, "test_stateful_loader_epoch_not_restored_is_caught")
    assert "(epoch 0's order replayed in epoch 1" in epoch
    assert "its epoch (sampler.epoch: uninterrupted 1, resumed 0)" in epoch
    for name in ("two_ranks_onto_one", "one_rank_onto_two"):
        section = section_of(text, f"test_global_cursor_resumes_from_{name}")
        # no sample ids recorded: the samples are known by their content
        assert "data exact: data (the model's inputs, by content): every sample" in section
    # the bug zoo's class 25 is this twin: its report must name the cause as the zoo says
    (case,) = [
        c
        for c in CASES
        if c.example.endswith("::test_per_process_skip_is_caught_on_another_world_size")
    ]
    skip = section_of(text, "test_per_process_skip_is_caught_on_another_world_size")
    missing = [phrase for phrase in case.expected if phrase not in skip]
    assert not missing, f"{case.name}: report lacks {missing}:\n{skip}"


def test_examples_collect_together(pytester):
    """The README's main job runs every example in one session: names must not collide."""
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    result = pytester.runpytest_subprocess(*CPU, "--collect-only", "-q", "examples")
    result.stdout.fnmatch_lines(["*28 tests collected*"])
    assert result.ret == 0


@pytest.mark.long(120)
def test_golden_example(pytester, monkeypatch):
    """Version 1 writes the golden with its checkpoint; a compatible refactor passes the
    resume test, the golden trajectory and the old checkpoint; a renamed optimizer key that
    the loader skips fails the old checkpoint (golden-only: one launch) with the cause at the
    resume point; a new init passes its resume test and fails the golden trajectory."""
    shutil.copytree(EXAMPLES / "golden", pytester.path / "golden")
    golden = ("--resume-equiv-golden=goldens", "golden")

    def run(version, *args):
        monkeypatch.setenv("TRAINER_VERSION", version)
        return pytester.runpytest_subprocess(*CPU, *golden, *args)

    made = run("1", "--resume-equiv-update-golden")
    made.assert_outcomes(passed=1)
    made.stdout.fnmatch_lines(
        ["*test_versioned_trainer: wrote the golden cpu-ws1-* (checkpoints split 2: * KiB)"]
    )

    refactor = run("2-refactor", "-v")
    refactor.assert_outcomes(passed=1)
    refactor.stdout.fnmatch_lines(
        [
            "*split 2 equal over 2 steps; teeth check off *; golden trajectory equal to the "
            "golden over 4 steps; "
            "checkpoint compatibility, split 2 passed (the checkpoint was written *"
        ]
    )

    renamed = run("2-renamed-key", "--resume-equiv-golden-only")
    renamed.assert_outcomes(failed=1)
    renamed.stdout.fnmatch_lines(
        [
            "resumed from the golden's checkpoint, the run is not the golden trajectory",
            "checkpoint compatibility, split 2: the current code resumed from the golden's "
            "checkpoint (the checkpoint was written * on cpu-ws1-*",
            "*the resumed run's state differs from the golden run (it wrote the stored "
            "checkpoint)'s at the same point: rank 0: watch:optimizer.state*",
            "  likely cause (optimizer never restored): rank 0: the optimizer 'optimizer' was "
            "never restored*",
            "*test_versioned_trainer: golden-only: checkpoint compatibility, split 2 failed",
        ]
    )
    assert "uninterrupted" not in renamed.stdout.str().split("= FAILURES =")[1].split("===")[0]

    init = run("2-new-init")
    init.assert_outcomes(failed=1)
    init.stdout.fnmatch_lines(
        [
            "golden trajectory: the uninterrupted run differs from the golden written *",
            "golden trajectory: first divergence at step 1, rank 0, key 'auto:loss'*",
        ]
    )
    text = init.stdout.str()
    assert "split 2: equal on its one rank over 2 steps" in text  # its own resume is fine
    assert "checkpoint compatibility, split 2: equal on its one rank" in text


@pytest.mark.long(150)
def test_crash_examples(pytester):
    """An atomic saver passes at every crash point; each of its three twins is caught at the
    point that breaks it, with the event named."""
    shutil.copytree(EXAMPLES / "crash", pytester.path / "crash")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "crash")
    result.assert_outcomes(passed=4)
    text = result.stdout.str()
    atomic = section_of(text, "test_an_atomic_save_survives_a_crash_at_every_point")
    assert "crash at split 4 passed (6 exact)" in atomic
    assert "rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)" in atomic
    for name, phrase in [
        ("test_saving_in_place_is_caught", "resumed from a torn or mixed checkpoint of step 2"),
        ("test_writing_latest_before_the_data_is_caught", "crashed on the torn checkpoint"),
        ("test_deleting_the_previous_checkpoint_first_is_caught", "lost the completed checkpoint"),
    ]:
        assert phrase in section_of(text, name), name


@pytest.mark.long(45)
def test_equivalent_example(pytester):
    """Two batchings of one training that equal its baseline, and the bug that does not."""
    shutil.copytree(EXAMPLES / "equivalent", pytester.path / "equivalent")
    result = pytester.runpytest_subprocess(*CPU, "-rP", "equivalent")
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    for name in ("accum4", "dp2_accum2"):
        assert f"variant {name}: {name} (" in text and "equal over 4 steps" in text
    assert "step 1: loss: baseline" in text and "(relative 0.5, round-off bound" in text
    assert "pytest_resume_equiv" not in (EXAMPLES / "equivalent" / "train.py").read_text()
