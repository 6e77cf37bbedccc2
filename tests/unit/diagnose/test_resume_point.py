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
    run,
)

FLAGS, LEAD = "resume.train-eval-flags", "lead.data-replayed"
NOT_SKIPPED, ADVANCED_ID = "lead.epoch-not-skipped", "resume.stream.restored-then-advanced"
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


# An epoch whose consumed batches were not skipped

SAMPLER = "rng:generator RandomSampler of the DataLoader built at train.py:12 #0"
"""The generator the loader's RandomSampler makes whenever an iterator starts (seeded from
the CPU RNG)."""
RESHUFFLED = {4: [1, 7], 5: [2, 10], 6: [5, 8]}
"""The resumed epoch's new permutation, not skipped: samples 1, 2 and 5 again (consumed at
steps 1-3 by the uninterrupted run, whose epoch of 12 samples is [2s-2, 2s-1] at step s)."""


def restarted_epoch(sampler_after, res_ids=RESHUFFLED.get):
    """The CPU RNG restored (train.py:30), then its restarted iterator's seed drawn and the
    sampler's permutation drawn (after `sampler_after` restores of 2) at the first fetch."""
    draws = [
        ("random_", "rng:cpu", "train.py:25", 2),
        ("randperm", SAMPLER, "train.py:26", sampler_after),
    ]
    res_point = point(rng={"cpu": "x"}, restores=2, draws=draws)
    base = {
        0: run(
            "uninterrupted",
            range(1, 7),
            lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [2 * s - 2, 2 * s - 1]},
            points=[point()],
        )
    }
    res = {
        0: run(
            "resumed",
            range(4, 7),
            lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", "ids": res_ids(s)},
            points=[res_point],
            restores=[LOAD, SET_CPU],
        )
    }
    return diagnose(compare_runs(base, res, SPLIT, 6), base, res)


@fires(NOT_SKIPPED)
def test_samples_consumed_again_by_an_iterator_started_after_every_restore_lead():
    """The sampler drew its permutation only at the first resumed fetch, after every restore:
    nothing was skipped, the saved steps' samples come again; the CPU RNG's advance (the seed
    drawn at that fetch) is a second finding."""
    d = restarted_epoch(sampler_after=2)
    named(
        d,
        NOT_SKIPPED,
        "data order",
        "step 4: the resumed run consumed again, at steps 4-6, the samples the uninterrupted "
        "run consumed at steps 1-3 before the split (3 samples, ids); its restarted iterator "
        "drew its permutation only when the loop fetched the first resumed batch (train.py:26, "
        "after every restore), so the batches the saved steps consumed in this epoch were not "
        "skipped",
        "skip exactly the batches the saved steps consumed (a counter of batches saved with "
        "the checkpoint, not recomputed)",
    )
    assert d.notes[0].startswith("also: rank 0: the CPU RNG (torch's default generator) was ")
    assert "and then advanced by 1 draw" in d.notes[0]


@look_alike(NOT_SKIPPED, wins=ADVANCED_ID)
def test_a_permutation_drawn_before_the_last_restore_leaves_the_stream_cause():
    """The sampler drew its permutation before the CPU RNG was restored (the skip ran there):
    the same samples again are no epoch left unskipped, the stream's advance stays the cause."""
    d = restarted_epoch(sampler_after=1)
    named(
        d,
        ADVANCED_ID,
        "restored then advanced",
        "the CPU RNG (torch's default generator) was restored (torch.set_rng_state at "
        "train.py:30) and then advanced by 1 draw",
        "restore the stream after that code runs",
    )
    assert not any(n.startswith("also: ") for n in d.notes)


@look_alike(NOT_SKIPPED, wins=ADVANCED_ID)
def test_an_iterator_started_after_every_restore_with_no_sample_again_is_no_lead():
    """The same late fetch, but the resumed steps consumed only samples of the uninterrupted
    run's steps after the split (in another order): nothing came again."""
    d = restarted_epoch(sampler_after=2, res_ids={4: [9, 6], 5: [11, 7], 6: [8, 10]}.get)
    assert d.rule == ADVANCED_ID, d.text()


@look_alike(NOT_SKIPPED, wins=LEAD)
def test_an_in_order_replay_leads_as_data_replayed_before_an_epoch_not_skipped():
    """HF Trainer with --ignore_data_skip and the sampler's permutation drawn at the first
    fetch, after every restore: both leads hold; the in-order replay is asked first."""
    late = [
        ("random_", "rng:cpu", "data_loader.py:572", 2),
        ("randperm", SAMPLER, "data_loader.py:573", 2),
    ]
    base, res = replayed_batches(point(rng={"cpu": "x"}, restores=2, draws=late), lambda s: f"x{s}")
    res[0].restores[:] = [LOAD, SET_CPU]
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.rule == LEAD, d.text()
    assert "consumed at steps 4-6 the samples of steps 1-3, in order" in d.cause
