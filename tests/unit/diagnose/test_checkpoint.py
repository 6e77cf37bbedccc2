"""Stage.CHECKPOINT (which checkpoint the resumed run loaded, and when it was written: read
from the restore log against the saving run's file events) and Stage.NO_DIVERGENCE (a resumed
run that recorded wrong steps: re-executed ones)."""

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose

from .builders import (
    LOAD,
    SPLIT,
    auto_runs,
    diagnosis,
    fires,
    inputs,
    look_alike,
    named,
    params,
    point,
    restore,
    saved,
)

OTHER_STEP, LATE = "checkpoint.another-steps-loaded", "checkpoint.written-late"
REWRITTEN, RE_EXECUTED = "checkpoint.rewritten", "no-divergence.re-executed-steps"

CKPT = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 50}
BASE, RES = point(checkpoint=CKPT), point(rng={"cpu": "x"}, checkpoint=CKPT, time_ns=1000)
"""The uninterrupted run's resume point at t=100, the resumed run's at t=1000."""
AT_SPLIT = saved("torch.save", 3, 50)


@fires(REWRITTEN, LATE)
@look_alike(REWRITTEN, wins=LATE)
def test_a_rewritten_checkpoint_and_a_late_one_are_told_apart_by_the_saving_runs_events():
    rewritten = diagnosis(BASE, RES, [LOAD], files=[AT_SPLIT, saved("torch.save", 5, 300)])
    assert rewritten.bug_class == "restored from another step"
    assert (
        "was written again by the uninterrupted run after it saved it at step 3" in rewritten.text()
    )
    assert "torch.save(rank-0.pt) after step 5" in rewritten.text()
    assert "put {split} in the checkpoint path" in rewritten.text()
    named(
        rewritten,
        REWRITTEN,
        "restored from another step",
        "the resumed run loaded a later save to the same path",
        "put {split} in the checkpoint path",
    )
    # written only after step 4: late, though it is also a write after the split
    late = diagnosis(BASE, RES, [LOAD], files=[saved("torch.save", 4, 300)])
    assert late.bug_class == "torn checkpoint" and "was not on disk when" in late.text()
    named(late, LATE, "torn checkpoint", "it was written later", "copy the state when the save")
    behind = diagnosis(BASE, RES, [LOAD], files=[AT_SPLIT, saved("open", 3, 150, thread="saver")])
    assert behind.bug_class == "torn checkpoint" and "in thread 'saver'" in behind.text()
    assert behind.rule == LATE


@look_alike(LATE, wins="resume.stream.never-restored")
@look_alike(REWRITTEN, wins="resume.stream.never-restored")
def test_a_checkpoint_the_resumed_run_writes_back_into_or_rewritten_after_it_loaded_is_no_cause():
    ckpt = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 5000}
    base, res = point(checkpoint=ckpt), point(rng={"cpu": "x"}, checkpoint=ckpt, time_ns=1000)
    own = [saved("torch.save", 4, 1200)]  # the resumed run saves its state into that folder
    after = [saved("torch.save", 3, 50), saved("torch.save", 5, 2000)]  # after the load
    for d in (
        diagnosis(base, res, [LOAD], files=[saved("torch.save", 3, 50)], res_files=own),
        diagnosis(base, res, [LOAD], files=after),
    ):
        assert d.bug_class == "never restored"  # the checkpoint is not the cause
        assert d.rule == "resume.stream.never-restored"


@look_alike(REWRITTEN, wins="resume.stream.never-restored")
def test_a_checkpoint_written_again_that_the_resumed_run_never_read_is_no_cause():
    """A newcomer's Lightning trainer given the checkpoint but looking in a folder of its own:
    it found nothing and started over; the saving run wrote `last.ckpt` again at every save
    (a rolling path), yet the resumed run loaded none of it."""
    rolling = [AT_SPLIT, saved("torch.save", 5, 300)]
    elsewhere = restore("torch.load", "file /elsewhere/last.ckpt")
    for loads in ([], [elsewhere]):
        d = diagnosis(BASE, RES, loads, files=rolling)
        assert d.rule == "resume.stream.never-restored", d.rule  # what differs, not the file


# Another step's checkpoint loaded (issue 30, item 2)


def newest_folder_case(read, files, base_params_at_point=3):
    """The uninterrupted run saves step 3 and step 6 (`files`); the resumed run was pointed at
    step 3's folder and its restore log reads `read`; what it restored is step 6's state."""

    def base_values(step):
        return {"loss": float(step), "rng:cpu": f"c{step}", "watch:model.params": params(step)}

    base = point(rng={"cpu": "c3"}, watch={"model.params": params(base_params_at_point)})
    res = point(
        rng={"cpu": "c6"},
        watch={"model.params": params(6)},
        restores=3,
        checkpoint={"path": "/ckpt/step_3"},
    )
    log = [
        restore("torch.load", f"file {read}", at="train.py:90"),
        restore("Module.load_state_dict", "watch:model"),
        restore("torch.set_rng_state", "rng:cpu", at="train.py:95"),
    ]
    return diagnosis(
        base,
        res,
        log,
        base_values=base_values,
        res_values=lambda s: {
            "loss": s + 3.0,
            "rng:cpu": f"c{s + 3}",
            "watch:model.params": params(s + 3),
        },
        files=files,
    )


SAVES = [
    saved("torch.save", 3, 50, "/ckpt/step_3/state.pt"),
    saved("torch.save", 6, 200, "/ckpt/step_6/state.pt"),
]


@fires(OTHER_STEP)
def test_a_checkpoint_of_a_later_step_is_named_before_the_rng_rules():
    d = newest_folder_case("/ckpt/step_6/state.pt", SAVES)
    assert d.bug_class == "another step's checkpoint loaded", d.text()
    assert d.text().startswith("rank 0: loaded the checkpoint of step 6, not the one of step 3")
    assert "read /ckpt/step_6/state.pt (torch.load at train.py:90)" in d.text()
    assert "equals the uninterrupted run's state after step 6" in d.text()
    assert d.text().count("Fix:") == 1
    assert "Fix: load the checkpoint the resume was pointed at (/ckpt/step_3)" in d.text()
    assert "CPU RNG" not in d.text()
    named(
        d,
        OTHER_STEP,
        "another step's checkpoint loaded",
        "loaded the checkpoint of step 6, not the one of step 3",
        "load the checkpoint the resume was pointed at (/ckpt/step_3)",
    )


@look_alike(LATE, wins=OTHER_STEP)
def test_another_steps_checkpoint_explains_a_given_one_written_late():
    """The given checkpoint was also written late (after step 4): what the resumed run read
    was another step's all the same, and that explains what it restored."""
    late = saved("torch.save", 4, 300, "/ckpt/step_3/late.pt")
    d = newest_folder_case("/ckpt/step_6/state.pt", [*SAVES, late])
    assert d.rule == OTHER_STEP, d.text()


@look_alike(OTHER_STEP, wins="resume.stream.restored-wrong")
def test_reading_the_given_checkpoint_is_no_other_step():
    d = newest_folder_case("/ckpt/step_3/state.pt", SAVES)
    assert d.bug_class != "another step's checkpoint loaded"
    # the first thing that differs at the resume point, the CPU RNG restored, answers
    assert d.rule == "resume.stream.restored-wrong", d.text()


# Re-executed steps: no divergence, the resumed run recorded other steps


@fires(RE_EXECUTED)
def test_a_resume_that_re_executes_the_epoch_it_was_saved_in_is_named():
    """The resumed run ran 6 steps, not 3: numbered 4-9, its inputs those of steps 1-6."""
    base, res = auto_runs(lambda s: inputs(s - 3), res_steps=range(4, 10))
    cmp = compare_runs(base, res, SPLIT, 6)
    assert cmp.divergence is None and cmp.problems
    d = diagnose(cmp, base, res)
    assert d.bug_class == "re-executed steps"
    assert "re-executed steps 1-3" in d.text() and d.text().count("Fix:") == 1
    named(
        d,
        RE_EXECUTED,
        "re-executed steps",
        "it recorded 3 steps past steps=6 (up to 9)",
        "save the number of the next epoch to run",
    )


@look_alike(RE_EXECUTED, wins=None)
def test_steps_past_the_end_without_a_replay_in_the_data_get_no_cause():
    base, res = auto_runs(inputs, res_steps=range(4, 10))
    assert diagnose(compare_runs(base, res, SPLIT, 6), base, res) is None


# Saved in the middle of an accumulation window

MID_WINDOW = "checkpoint.saved-mid-window"
MID_STEP = saved("torch.save", SPLIT, 150)
"""Written again in the training thread after the uninterrupted run's resume point (t=100),
while step 3 was still the last optimizer step: after step 4's first micro-batch."""
HELD = point(checkpoint=CKPT, time_ns=1000)
"""The resumed run's resume point, equal to the uninterrupted run's (no optimizer step came
between the save and it)."""


def per_backward(losses):
    """Recorded automatically: a loss per backward() of each step (`losses(step)`)."""
    return lambda s: {"auto:loss": losses(s), "rng:cpu": f"c{s}"}


TWO_MICRO_BATCHES = per_backward(lambda s: [s / 2, s / 3])


def mid_window(files, base_values=TWO_MICRO_BATCHES, first_losses=(4 / 3,)):
    """The uninterrupted run's steps accumulate `base_values`; the resumed run's step 4
    recorded `first_losses` (by default the last of step 4's two micro-batches, bit for bit)."""

    def res_values(s):
        return {"auto:loss": list(first_losses) if s == 4 else [s / 5, s / 7], "rng:cpu": f"c{s}"}

    return diagnosis(BASE, HELD, [LOAD], base_values, res_values, files=files)


@fires(MID_WINDOW)
def test_a_checkpoint_written_again_after_the_next_steps_first_micro_batch_was_saved_mid_window():
    d = mid_window([AT_SPLIT, MID_STEP])
    named(
        d,
        MID_WINDOW,
        "gradient accumulation",
        "was written again after the uninterrupted run began step 4 (rank 0: "
        "torch.save(rank-0.pt), before that step's optimizer step), in the middle of its "
        "accumulation window of 2 micro-batches: the accumulated gradients of the micro-batches "
        "before the save (1 micro-batch) are not in the checkpoint",
        "save only at an optimizer step (where the gradients are synchronized and zeroed",
    )
    assert d.cause.startswith("rank 0: the checkpoint at /ckpt/step_3 ")
    assert d.evidence["lost"] == 1 and d.evidence["micro_batches"] == 2
    # losses that are not the uninterrupted run's last ones count no lost micro-batch
    other = mid_window([AT_SPLIT, MID_STEP], first_losses=(9.0,))
    named(
        other,
        MID_WINDOW,
        "gradient accumulation",
        "of 2 micro-batches: the accumulated gradients of the micro-batches before the save are",
        "or save the accumulated gradients with the checkpoint and restore them",
    )
    assert other.evidence["lost"] is None and "micro-batch)" not in other.cause


@look_alike(MID_WINDOW, wins=LATE)
def test_a_write_after_the_split_in_a_background_thread_is_written_late_not_mid_window():
    d = mid_window([AT_SPLIT, saved("torch.save", SPLIT, 150, thread="saver")])
    assert d.rule == LATE, d.text()
    assert "in thread 'saver'" in d.cause and "accumulation window" not in d.cause


@look_alike(MID_WINDOW, wins=REWRITTEN)
def test_a_later_steps_save_to_the_same_path_explains_a_mid_window_write():
    """The mid-step write is there too, but a save after step 5 to the same path is what the
    resumed run loaded."""
    d = mid_window([AT_SPLIT, MID_STEP, saved("torch.save", 5, 300)])
    assert d.rule == REWRITTEN, d.text()
    assert "torch.save(rank-0.pt) after step 5" in d.cause


@look_alike(MID_WINDOW, wins="held.computed-differently")
def test_a_write_during_a_step_of_one_micro_batch_is_no_accumulation_window():
    """The same write after step 4 began, but step 4 took one backward: no window to save
    in the middle of (here the resume point held, so the step computed differently)."""
    one = per_backward(lambda s: [s / 2])
    d = mid_window([AT_SPLIT, MID_STEP], base_values=one, first_losses=(9.0,))
    assert d.rule == "held.computed-differently", d.text()
    assert d.bug_class != "gradient accumulation"


@fires(MID_WINDOW)
@look_alike(LATE, wins=MID_WINDOW)
def test_a_checkpoint_written_only_inside_the_next_steps_window_was_saved_mid_window():
    """One save, in the training thread, after the next step's first micro-batch: not on disk
    when the uninterrupted run went on, but no optimizer step changed the tensors in between,
    so not a torn checkpoint: the accumulated gradients are what it lacks."""
    d = mid_window([MID_STEP])
    named(
        d,
        MID_WINDOW,
        "gradient accumulation",
        "was written after the uninterrupted run began step 4",
        "or save the accumulated gradients with the checkpoint and restore them",
    )
    assert "written again" not in d.cause and "changed the tensors" not in d.cause


@look_alike(MID_WINDOW, wins=LATE)
def test_a_checkpoint_first_written_after_the_next_optimizer_step_is_late_not_mid_window():
    """Steps of two micro-batches, one save, made after step 4's optimizer step: the tensors
    changed before it was written (the bug zoo's torn checkpoint), not a window cut short."""
    d = mid_window([saved("torch.save", 4, 300)])
    assert d.rule == LATE, d.text()
    assert "was not on disk when the uninterrupted run went on past step 3" in d.cause
