"""The data rules: what a divergent step consumed (the trainer's sample ids, or the automatic
records of the DataLoader's batches and the model's inputs by content) against the
uninterrupted run's. They are asked at any divergent step, in Stage.STEP (the resume point
explains nothing) and Stage.HELD (it matched bit for bit) alike."""

import pytest

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose
from pytest_resume_equiv.diagnose.evidence import Evidence
from pytest_resume_equiv.diagnose.subject import held_at_resume

from .builders import (
    LOAD,
    SPLIT,
    STEPS,
    auto_runs,
    diagnosed,
    fires,
    inputs,
    look_alike,
    named,
    point,
    run,
)

LOST, AGAIN, REPLAYED = "data.lost-batch", "data.skipped-again", "data.ids-replay-an-epoch"
ORDER, WORKERS = "data.ids-order", "data.worker-seeds"
AFTER_LOADING, INPUTS_ORDER = "data.changed-after-loading", "data.inputs-order"
UNKNOWN = "data.inputs-unknown"

STEP, HELD = "step", "held"
ELSEWHERE = "first forward of Net at train.py:31"


def runs_in(stage, base_values, res_values):
    """Runs that took no resume-point snapshot (`STEP`), or equal ones (`HELD`)."""
    held = stage == HELD
    base = {0: run("uninterrupted", range(1, 7), base_values, points=[point()] if held else [])}
    res = {
        0: run(
            "resumed",
            range(4, 7),
            res_values,
            points=[point(restores=1)] if held else [],
            restores=[LOAD] if held else [],
        )
    }
    return base, res


def auto_in(stage, res_inputs, **given):
    """auto_runs with an exact resume point (`HELD`), or one taken at another place (`STEP`)."""
    res_point = None if stage == HELD else point(restores=1, at=ELSEWHERE)
    return auto_runs(res_inputs, res_point=res_point, **given)


def diagnosed_in(stage, runs):
    base, res = runs
    ev = Evidence.of(compare_runs(base, res, SPLIT, STEPS), base, res)
    assert held_at_resume(ev) is (stage == HELD)
    return diagnosed(base, res)


def ids(of):
    """A step's record: the loss and the sample ids `of(step)`."""
    return lambda s: {"loss": 1.0, "ids": of(s), "rng:cpu": "c"}


EPOCHS = {1: [0, 5], 2: [3, 1], 3: [7, 2], 4: [6, 4], 5: [1, 7], 6: [0, 2]}
"""8 samples, 2 per step: steps 1-4 are epoch 0."""
REPLAY = {s: EPOCHS[s - 4 if s > 4 else s] for s in EPOCHS}
"""The resumed epoch 1 consumes epoch 0's order again."""


def content(shift):
    """The trainer's sample ids match, the model's inputs by content are shifted."""
    return lambda s: {"loss": s / (2 + shift), "ids": [s], "auto:data": [s * 10 + shift]}


def new(step):
    """Inputs found nowhere in the uninterrupted run."""
    return [i + 7 for i in inputs(step)]


CASES = {
    LOST: (
        lambda stage: runs_in(stage, ids(lambda s: [s]), ids(lambda s: [s + 1])),
        "data order",
        "consumed the batch the uninterrupted run consumed at step 5",
        "save a prefetched batch (or its indices) with the checkpoint",
    ),
    AGAIN: (
        lambda stage: runs_in(stage, ids(lambda s: [s]), ids(lambda s: [s + 1] if s == 5 else [s])),
        "skipped again",
        "the resumed run matched through step 4, then consumed the samples of step 6 (ids)",
        "apply the resume's skip once and reset it in the worker",
    ),
    REPLAYED: (
        lambda stage: runs_in(stage, ids(EPOCHS.get), ids(REPLAY.get)),
        "data order",
        "the resumed epoch 1 consumes the samples of epoch 0's steps 1-2, in order",
        "restore the sampler's epoch before iterating (set_epoch(saved_epoch))",
    ),
    ORDER: (
        lambda stage: runs_in(stage, ids(lambda s: [s]), ids(lambda s: [s + 10])),
        "data order",
        "sample ids differ (ids) while every audited RNG stream matches",
        "skip exactly the batches the saved steps consumed",
    ),
    WORKERS: (
        lambda stage: runs_in(stage, content(0), content(1)),
        "dataloader workers",
        "sample content differs (auto:data) while the sample ids (ids)",
        "restore the RNG the loader draws its base seed from before the iterator starts",
    ),
    AFTER_LOADING: (
        lambda stage: auto_in(stage, new, loaded=(inputs, inputs)),
        "unaudited input",
        "the samples were changed after loading, in the training loop",
        "draw that randomness from torch's RNG or a torch.Generator",
    ),
    INPUTS_ORDER: (
        lambda stage: auto_in(stage, lambda s: inputs(s - 1)),
        "data order",
        "step 4 consumed the batch of step 3 again",
        "skip exactly the batches the saved steps consumed",
    ),
    UNKNOWN: (
        lambda stage: auto_in(stage, new),
        "unknown",
        "what was recorded cannot tell which, so the cause is unknown",
        "record each batch's sample ids",
    ),
}


@fires(*CASES)
@pytest.mark.parametrize("stage", [STEP, HELD])
@pytest.mark.parametrize("rule", list(CASES))
def test_each_data_rule_names_its_cause_whether_the_resume_point_held_or_not(rule, stage):
    runs, bug_class, words, fix = CASES[rule]
    named(diagnosed_in(stage, runs(stage)), rule, bug_class, words, fix)


# The trainer's sample ids


@fires(LOST)
def test_without_a_resume_point_the_first_divergent_step_decides():
    base = {
        0: run("uninterrupted", range(1, 7), lambda s: {"loss": 1.0, "ids": [s], "rng:cpu": "c"})
    }
    res = {0: run("resumed", range(4, 7), lambda s: {"loss": 1.0, "ids": [s + 1], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order" and "sample ids differ (ids)" in d.text()
    assert d.rule == LOST


@fires(LOST)
@pytest.mark.parametrize("key", ["ids", "x"])
def test_a_batch_lost_at_the_resume_names_the_prefetch_and_the_skip_count(key):
    """The first resumed step consumed the uninterrupted run's next batch: one batch lost."""
    base = {0: run("uninterrupted", range(1, 7), lambda s: {key: [s], "rng:cpu": "c"})}
    res = {0: run("resumed", range(4, 7), lambda s: {key: [s + 1], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert "consumed the batch the uninterrupted run consumed at step 5" in d.text()
    assert "prefetched" in d.text() and "number of batches skipped" in d.text()
    what = "sample ids" if key == "ids" else "sample content"
    named(d, LOST, "data order", f"{what} differ ({key})", "fetch each batch at the top")


@look_alike(LOST, wins=ORDER)
@look_alike(REPLAYED, wins=ORDER)
def test_another_order_is_no_lost_batch():
    base = {0: run("uninterrupted", range(1, 7), lambda s: {"ids": [s], "rng:cpu": "c"})}
    res = {0: run("resumed", range(4, 7), lambda s: {"ids": [s + 10], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order" and "lost" not in d.text()
    assert d.rule == ORDER and "consumes the samples of epoch" not in d.text()


@look_alike(AGAIN, wins=LOST)
def test_a_later_steps_samples_at_the_first_resumed_step_are_a_lost_batch_not_a_skip_again():
    d = diagnosed_in(STEP, runs_in(STEP, ids(lambda s: [s]), ids(lambda s: [s + 1])))
    assert d.rule == LOST, d.text()


@fires(REPLAYED)
@look_alike(ORDER, wins=REPLAYED)
def test_a_data_order_cause_names_the_replayed_epoch_from_the_ids():
    """8 samples, 2 per step: steps 1-4 are epoch 0; the resumed epoch 1 consumes epoch 0's
    order again."""
    base = {0: run("uninterrupted", range(1, 7), lambda s: {"loss": 1.0, "ids": EPOCHS[s]})}
    res = {0: run("resumed", range(4, 7), lambda s: {"loss": 1.0, "ids": REPLAY[s]})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert "the resumed epoch 1 consumes the samples of epoch 0's steps 1-2, in order" in d.text()
    # every audited stream matches: the sampler's epoch first, then a generator's state
    assert "Fix: restore the sampler's epoch before iterating (set_epoch(saved_epoch))" in d.text()
    assert "otherwise save the shuffling generator's state from before" in d.text()
    assert d.text().count("Fix:") == 1
    assert d.rule == REPLAYED


@fires(WORKERS)
def test_inputs_that_differ_beside_recorded_ids_that_match_are_the_worker_seeds():
    """The trainer records its sample ids (an explicit call: what automatic recording cannot
    tell apart from content), the model's inputs by content differ: the same samples made
    otherwise, by loader workers seeded anew."""
    base = {0: run("uninterrupted", range(1, 7), content(0), points=[point()])}
    res = {0: run("resumed", range(4, 7), content(1), points=[point(restores=1)], restores=[LOAD])}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "dataloader workers", d.text()
    assert "sample content differs (auto:data) while the sample ids (ids)" in d.text()
    assert d.rule == WORKERS


@look_alike(WORKERS, wins=ORDER)
def test_content_beside_ids_that_differ_too_is_the_order():
    def values(shift):
        return lambda s: {"loss": 1.0, "ids": [s + 10 * shift], "auto:data": [s * 10 + shift]}

    d = diagnosed_in(HELD, runs_in(HELD, values(0), values(1)))
    assert d.rule == ORDER, d.text()


# The model's inputs by content (auto:data), with no sample ids recorded (issue 31)


@fires(INPUTS_ORDER)
def test_a_batch_lost_at_the_resume_is_named_from_the_inputs():
    base, res = auto_runs(lambda s: inputs(s + 1))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert "the batch of step 4 was never consumed" in d.text()
    assert "one batch was lost at the resume" in d.text()
    assert d.rule == INPUTS_ORDER


@fires(UNKNOWN)
@look_alike(INPUTS_ORDER, wins=UNKNOWN)
def test_new_inputs_with_nothing_to_tell_samples_from_transforms_are_an_unknown_cause():
    """Inputs found nowhere in the uninterrupted run, every audited stream matching, no loader
    seen: other samples (another order, ones the uninterrupted run did not reach) and the same
    samples transformed make them alike. Neither is named; the Fix says how to tell."""
    base, res = auto_runs(new)
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unknown", d.text()
    assert "other samples (another order, or ones the uninterrupted run did not reach" in d.text()
    assert "or the same samples transformed otherwise" in d.text()
    assert "the cause is unknown" in d.text() and d.text().count("Fix:") == 1
    assert "record each batch's sample ids" in d.text().split("Fix:")[1]
    for wrong in ("never seen", "seen twice", "never consumed", "data order was not restored"):
        assert wrong not in d.text()
    assert d.rule == UNKNOWN


@look_alike(UNKNOWN, wins=INPUTS_ORDER)
def test_inputs_of_another_step_are_their_order_not_an_unknown_cause():
    d = diagnosed_in(HELD, auto_in(HELD, lambda s: inputs(s - 1)))
    assert d.rule == INPUTS_ORDER and "the cause is unknown" not in d.text()


@fires(AFTER_LOADING)
@look_alike(INPUTS_ORDER, wins=AFTER_LOADING)
@look_alike(UNKNOWN, wins=AFTER_LOADING)
def test_loaded_batches_that_match_name_the_change_after_loading():
    """Noise added in the loop from a source the audit does not see: the batches the
    DataLoader yielded are the uninterrupted run's, the model's inputs are not. The samples
    were changed after loading: that, not their order, and not "unknown"."""
    base, res = auto_runs(new, loaded=(inputs, inputs))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unaudited input", d.text()
    assert "the batches the DataLoader yielded are the uninterrupted run's" in d.text()
    assert "changed after loading" in d.text() and d.text().count("Fix:") == 1
    assert d.rule == AFTER_LOADING


@fires(INPUTS_ORDER)
@look_alike(AFTER_LOADING, wins=INPUTS_ORDER)
def test_a_batch_skipped_under_noise_is_named_from_the_loaded_batches():
    """A diffusion trainer: noise added to every batch in the loop, so every input of the
    resumed run is new whatever its order. The batches the DataLoader yielded show the skip."""
    batches = (inputs, lambda s: inputs(s + 1))
    base, res = auto_runs(lambda s: new(s + 1), loaded=batches)
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "the batches the DataLoader yielded (auto:batch" in d.text()
    assert "the batch of step 4 was never consumed" in d.text()
    assert "one batch was lost at the resume" in d.text() and d.text().count("Fix:") == 1
    assert d.rule == INPUTS_ORDER


@fires(INPUTS_ORDER)
def test_inputs_shifted_by_part_of_a_batch_are_the_data_order_not_unaudited_randomness():
    """A step of two micro-batches, the resume skipping one micro-batch too many: no resumed
    step holds another step's whole batch, and the inputs past the uninterrupted run's end
    are found nowhere in it, yet the samples moved: the data order, counted by sample."""
    flat = [k for s in range(1, 9) for k in inputs(s)]

    def shifted(step):
        start = (step - 1) * 4 + 2
        return flat[start : start + 4]

    base, res = auto_runs(shifted)
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "2 samples never seen and 4 samples consumed at another step" in d.text()
    assert "number of batches skipped" in d.text() and d.text().count("Fix:") == 1
    assert d.rule == INPUTS_ORDER


@fires(AGAIN)
def test_inputs_of_a_later_step_after_matching_ones_are_a_skip_made_again():
    """The resumed run matched at step 4, then consumed step 6's inputs at step 5 (by content,
    no ids): the resume's skip applied a second time (a persistent worker's)."""
    base, res = auto_runs(lambda s: inputs(s + 1) if s == 5 else inputs(s))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "skipped again", d.text()
    assert "the resumed run matched through step 4, then consumed the samples of step 6" in d.text()
    assert d.rule == AGAIN


def test_ignore_covers_the_gate_and_the_data_lines_that_read_an_ignored_key():
    """ignore=["auto:batch", "auto:data"]: the resume-point gate's sample check and the data
    account leave them out too (issue 40: the control failed while it printed "equal")."""
    from pytest_resume_equiv.compare.accounting import account
    from pytest_resume_equiv.compare.gate import gate
    from pytest_resume_equiv.compare.tolerance import ComparisonRules

    def values(offset):
        return lambda s: {"loss": 1.0, "auto:batch": [10 * s + offset, 10 * s + offset + 1]}

    base = {0: run("uninterrupted", range(1, 7), values(0), points=[point()])}
    res = {0: run("resumed", range(4, 7), values(5), points=[point(restores=1)], restores=[LOAD])}
    held = gate(base, None, res, SPLIT, ComparisonRules(6, ignore=("auto:batch", "auto:data")))
    assert held.status == "held", held.differing
    assert gate(base, None, res, SPLIT, ComparisonRules(6)).status == "failed"
    assert account(base, res, SPLIT, 6, ("auto:*",)) == []
    assert [a.key for a in account(base, res, SPLIT, 6)] == ["auto:batch"]
