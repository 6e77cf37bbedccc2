"""Stage.RESUME_POINT (facts of the resume point read over every rank: the train/eval flags)
and Stage.LEAD (a data replay that leads over the stream cause the resume point gave)."""

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose, diagnose_resume_point

from .builders import (
    LOAD,
    SET_CPU,
    SPLIT,
    auto_runs,
    diagnosis,
    fires,
    inputs,
    look_alike,
    named,
    point,
)

FLAGS, LEAD = "resume.train-eval-flags", "lead.data-replayed"
FLAGS_BASE = {"model.modes": [], "model.params": {}}
FLAGS_RES = {"model.modes": ["<root>", "drop"], "model.params": {}}


@fires(FLAGS)
def test_train_eval_flags_come_before_any_rng_explanation():
    d = diagnosis(
        point(watch=FLAGS_BASE), point(rng={"cpu": "x"}, watch=FLAGS_RES, restores=1), [LOAD]
    )
    assert d.bug_class == "left in the wrong mode"
    assert "<root>, drop in eval mode in the resumed run only" in d.text()
    named(
        d,
        FLAGS,
        "left in the wrong mode",
        "the train/eval flags of model differ",
        "model.train() after loading",
    )


@look_alike(FLAGS, wins="resume.object.module-never-restored")
def test_flags_of_snapshots_taken_at_different_places_are_no_wrong_mode():
    """The resumed snapshot at an eval's forward, the uninterrupted one at resume_point():
    eval mode there says nothing about the restore."""
    at_eval = "first forward of GPT at train.py:31"
    d = diagnosis(point(watch=FLAGS_BASE), point(watch=FLAGS_RES, restores=1, at=at_eval), [LOAD])
    assert d is None or d.bug_class != "left in the wrong mode"
    # the module differs there and no load_state_dict restored it
    assert d.rule == "resume.object.module-never-restored", d.text()


def replayed_batches(res_point, res_rng):
    """HF Trainer with --ignore_data_skip: the resumed epoch starts over, so steps 4-6 consume
    the batches of steps 1-3 (the DataLoader's and the model's inputs alike)."""
    batches = (inputs, lambda s: inputs(s - 3))
    return auto_runs(lambda s: inputs(s - 3), res_point=res_point, res_rng=res_rng, loaded=batches)


ADVANCED = point(
    rng={"cpu": "x"}, restores=2, draws=[("random_", "rng:cpu", "data_loader.py:572", 2)]
)
"""The CPU RNG restored, then advanced by the resumed epoch's iterator seed."""


@fires(LEAD)
@look_alike("resume.stream.restored-then-advanced", wins=LEAD)
def test_batches_replayed_lead_over_a_stream_restored_then_advanced():
    """A stream restored from the saved state replays no earlier data: the replay leads, the
    advance is noted."""
    base, res = replayed_batches(ADVANCED, lambda s: f"x{s}")
    res[0].restores[:] = [LOAD, SET_CPU]
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "consumed at steps 4-6 the samples of steps 1-3, in order" in d.text()
    assert "started the data over from an earlier place" in d.text()
    assert d.text().count("Fix:") == 1
    assert any("restored (torch.set_rng_state" in n and "advanced by" in n for n in d.notes)
    named(
        d,
        LEAD,
        "data order",
        "which a random stream restored from the saved state does not replay",
        "restore the loader's state before iterating",
    )
    assert d.notes[0].startswith("also: rank 0: the CPU RNG")


@look_alike(LEAD, wins="resume.stream.never-restored")
def test_a_stream_never_restored_stays_the_cause_of_a_replay():
    """A stream never restored does replay the data it drew: it stays the cause."""
    base, res = replayed_batches(point(rng={"cpu": "x"}, restores=1), lambda s: f"x{s}")
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "never restored"
    assert d.rule == "resume.stream.never-restored"


@look_alike(LEAD, wins="resume.stream.restored-then-advanced")
def test_the_resume_point_alone_names_the_stream_not_the_lead():
    """diagnose_resume_point, for a gate that failed while the trajectory did not, asks the
    resume-point stages alone: no lead replaces their cause."""
    base, res = replayed_batches(ADVANCED, lambda s: f"x{s}")
    res[0].restores[:] = [LOAD, SET_CPU]
    d = diagnose_resume_point(compare_runs(base, res, SPLIT, 6), base, res)
    named(
        d,
        "resume.stream.restored-then-advanced",
        "restored then advanced",
        "advanced by 1 draw before the first resumed step",
        "restore the stream after that code runs",
    )
