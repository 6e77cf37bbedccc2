"""The notes (`registry.NOTES`): sentences said beside a cause of the classes they apply to,
never a cause of their own."""

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose

from .builders import (
    LOAD,
    SET_CPU,
    SPLIT,
    auto_runs,
    diagnosed,
    diagnosis,
    inputs,
    noted,
    point,
    run,
)

DRAWN, EFFECT, OTHER_RANKS = (
    "note.drawn-before-restore",
    "note.inputs-are-an-effect",
    "note.only-other-ranks",
)


def drawn_before_restore(notes):
    return [n for n in notes if "before it was restored" in n]


@noted(DRAWN)
def test_a_data_order_difference_gets_a_lead_about_a_draw_before_a_restore():
    same = point(restores=2, draws=[("random_", "rng:cpu", "loader.py:9", 1)])
    base = {
        0: run(
            "uninterrupted", range(1, 7), lambda s: {"ids": [s], "rng:cpu": "c"}, points=[point()]
        )
    }
    res = {
        0: run(
            "resumed",
            range(4, 7),
            lambda s: {"ids": [s + 1], "rng:cpu": "c"},
            points=[same],
            restores=[LOAD, SET_CPU],
        )
    }
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert any(
        "was drawn from (random_ at loader.py:9) before it was restored" in n for n in d.notes
    )
    assert d.rule == "data.lost-batch"


@noted(DRAWN)
def test_new_inputs_after_a_draw_before_the_restore_get_the_workers_lead():
    """Augmentation in DataLoader workers: their seeds come from a base seed the iterator drew
    from the CPU RNG before the trainer restored it. The CPU RNG matches at the resume point,
    the inputs are new: the draw before the restore is the lead."""
    drew = point(restores=2, draws=[("random_", "rng:cpu", "dataloader.py:9", 1)])
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s)], res_point=drew)
    res[0].restores[:] = [LOAD, SET_CPU]
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unknown", d.text()
    assert any(
        "drawn from (random_ at dataloader.py:9) before it was restored" in n for n in d.notes
    )
    assert d.rule == "data.inputs-unknown"


def test_a_draw_before_a_restore_is_no_note_beside_a_stream_cause():
    """The stream that was drawn from before its restore is the cause itself: said there,
    not noted again."""
    base = point(draws=[("randn", "rng:cpu", "collate.py:9", 0)])
    res = point(rng={"cpu": "x"}, restores=2, draws=[("randn", "rng:cpu", "collate.py:9", 1)])
    d = diagnosis(base, res, [LOAD, SET_CPU])
    assert d.rule == "resume.stream.restored-too-late"
    assert drawn_before_restore(d.notes) == []


@noted(EFFECT)
def test_new_inputs_from_a_stream_not_restored_blame_the_stream_and_note_the_effect():
    base, res = auto_runs(
        lambda s: [i + 7 for i in inputs(s)],
        res_rng=lambda s: f"x{s}",
        res_point=point(rng={"cpu": "x"}, restores=1),
    )
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "never restored", d.text()
    assert any("found nowhere in the uninterrupted run from step 4 on" in n for n in d.notes)
    assert d.rule == "resume.stream.never-restored"


@noted(EFFECT)
def test_loaded_batches_that_match_beside_a_stream_cause_say_the_inputs_changed_after_loading():
    base, res = auto_runs(
        lambda s: [i + 7 for i in inputs(s)],
        res_rng=lambda s: f"x{s}",
        res_point=point(rng={"cpu": "x"}, restores=1),
        loaded=(inputs, inputs),
    )
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.rule == "resume.stream.never-restored", d.text()
    assert any("the samples were changed after loading" in n for n in d.notes), d.notes


def test_inputs_are_no_effect_beside_a_data_cause():
    """A data cause names the inputs itself."""
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s)])
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.rule == "data.inputs-unknown"
    assert not any("found nowhere" in n for n in d.notes), d.notes


def two_ranks(rank_0_differs):
    """Two ranks, without resume points; rank 1's loss differs after the resume, rank 0's
    only when `rank_0_differs`."""

    def values(r, resumed):
        return lambda s: {"loss": 1.0 + s + (0.5 if resumed and (r or rank_0_differs) else 0)}

    base = {r: run("uninterrupted", range(1, 7), values(r, False), rank=r) for r in (0, 1)}
    res = {r: run("resumed", range(4, 7), values(r, True), rank=r) for r in (0, 1)}
    return diagnosed(base, res)


@noted(OTHER_RANKS)
def test_values_that_differ_on_other_ranks_only_point_at_state_saved_from_rank_0():
    d = two_ranks(rank_0_differs=False)
    assert d.rule == "step.unaudited-state"
    assert d.notes == [
        "rank 0's recorded values and random streams match; only rank 1 differs: per-rank "
        "state (RNG, data cursor, extra_state) was probably saved from rank 0 only, or keyed "
        "by local rank instead of global rank"
    ]


def test_values_that_differ_on_rank_0_too_get_no_other_ranks_note():
    assert two_ranks(rank_0_differs=True).notes == []


@noted(EFFECT)
def test_inputs_short_of_a_micro_batch_are_no_change_after_loading():
    """The accelerate example saved mid-window: the loader's recorded batches match, the
    model was given half the inputs at the first resumed step: a micro-batch not run, not
    samples changed after loading."""
    base, res = auto_runs(
        lambda s: inputs(s)[:2] if s == 4 else inputs(s),
        res_rng=lambda s: f"x{s}",
        res_point=point(rng={"cpu": "x"}, restores=1),
        loaded=(inputs, inputs),
    )
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.rule == "resume.stream.never-restored", d.text()
    assert any("given 2 inputs fewer at step 4" in n for n in d.notes), d.notes
    assert not any("changed after loading" in n for n in d.notes), d.notes
