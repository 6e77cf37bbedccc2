"""`Stage.CONFIGURATION`: the cause of a difference between two configurations of one training
(`@equivalent`), each rule on hand-made steps of its own (every rank's records, as
compare/global_step.py reads them) and against the look-alike whose evidence resembles its
own."""

from __future__ import annotations

from collections import Counter

from pytest_resume_equiv.compare.configurations import ConfigurationFacts, Difference
from pytest_resume_equiv.compare.global_step import GlobalStep, RankStep
from pytest_resume_equiv.diagnose import diagnose_configurations
from pytest_resume_equiv.diagnose.classes import (
    CLIPPING_ON_LOCAL_SHARDS,
    CLIPPING_PER_MICRO_STEP,
    DATA_ORDER_BY_CONFIGURATION,
    DRAWN_BY_CONSTRUCTION,
    GRADIENTS_ZEROED_IN_WINDOW,
    LOSS_NOT_SCALED_BY_ACCUMULATION,
    LOSS_SCALED_BY_WORLD_SIZE,
    PER_RANK_BATCH_STATISTICS,
    SAME_DATA_ON_EVERY_RANK,
    SCHEDULER_COUNTER_ONLY,
    SCHEDULER_PER_MICRO_STEP,
    SCHEDULER_PER_RANK,
    TOKEN_MEAN_PER_MICRO_BATCH,
    UNKNOWN,
)

from .builders import fires, look_alike, named


def rank(losses=(0.5,), before=None, after=None, stepped=None, samples=(1, 2), **more) -> RankStep:
    """One rank's step: `after` defaults to a gradient that accumulates (1, 2, ...), `before`
    to what the previous backward left (0 first), `stepped` to the last `after`."""
    n = len(losses)
    after = list(after) if after is not None else [float(i + 1) for i in range(n)]
    before = list(before) if before is not None else [0.0, *after[:-1]]
    stepped = stepped if stepped is not None else after[-1]
    return RankStep(list(losses), before, after, stepped, samples=Counter(samples), **more)


def step(*ranks: RankStep, loss=None) -> GlobalStep:
    g = GlobalStep(ranks=dict(enumerate(ranks)))
    for r in ranks:
        g.samples.update(r.samples)
    g.numbers["loss"] = loss if loss is not None else sum(sum(r.losses) for r in ranks) / len(ranks)
    return g


def facts(baseline: GlobalStep, variant: GlobalStep, *whats, dropout=None, ignore=()):
    """The configurations differ at step 1 in each of `whats` (the loss by default)."""
    found = ConfigurationFacts("1 rank", "v", steps=1, dropout=dropout or {}, ignore=list(ignore))
    found.differences = [Difference(what, 1, 1.0, 2.0) for what in whats or ("loss",)]
    found.baseline_steps, found.variant_steps = {1: baseline}, {1: variant}
    return found


BASE = step(rank(samples=(1, 2, 3, 4)))
"""One rank, one backward: the plain baseline."""


@fires("configuration.dropout-drawn")
def test_dropout_kept_that_drew_masks_is_blamed_on_no_code():
    d = diagnose_configurations(facts(BASE, step(rank(dropout=3)), dropout={"drawn": 3}))
    named(d, "configuration.dropout-drawn", DRAWN_BY_CONSTRUCTION, "no code is blamed", "off")


@look_alike("configuration.dropout-drawn", None)
def test_dropout_made_an_identity_explains_nothing():
    d = diagnose_configurations(facts(BASE, step(rank(dropout_off=3)), dropout={"off": 3}))
    named(d, "configuration.unexplained", UNKNOWN, "cause unknown")


@fires("configuration.same-data-on-every-rank")
@look_alike("configuration.unexplained", "configuration.same-data-on-every-rank")
def test_every_rank_taking_the_same_samples():
    variant = step(rank(samples=(1, 2)), rank(samples=(1, 2)))
    d = diagnose_configurations(facts(BASE, variant, "samples consumed"))
    named(d, "configuration.same-data-on-every-rank", SAME_DATA_ON_EVERY_RANK, "2 times", "rank=")


@fires("configuration.other-samples")
@look_alike("configuration.same-data-on-every-rank", "configuration.other-samples")
def test_ranks_with_shares_of_their_own_that_are_other_samples():
    variant = step(rank(samples=(1, 2)), rank(samples=(3, 5)))
    d = diagnose_configurations(facts(BASE, variant, "samples consumed"))
    named(
        d,
        "configuration.other-samples",
        DATA_ORDER_BY_CONFIGURATION,
        "holds 1 of 4 samples the baseline's does not",
        "use_seedable_sampler=True",
    )


@look_alike("configuration.other-samples", "configuration.same-data-on-every-rank")
def test_samples_repeated_by_every_rank_are_named_as_such_not_as_an_order():
    variant = step(rank(samples=(1, 2)), rank(samples=(1, 2)))
    d = diagnose_configurations(facts(BASE, variant, "samples consumed"))
    assert d is not None and d.rule == "configuration.same-data-on-every-rank"


@fires("configuration.zeroed-in-window")
def test_gradients_zeroed_between_two_backwards():
    variant = step(rank(losses=(0.25, 0.25), before=[0.0, 0.0], after=[1.0, 0.9]))
    d = diagnose_configurations(facts(BASE, variant))
    named(
        d,
        "configuration.zeroed-in-window",
        GRADIENTS_ZEROED_IN_WINDOW,
        "between backward 1 and 2",
        "zero the gradients once per optimizer step",
    )


@look_alike("configuration.zeroed-in-window", None)
def test_gradients_held_elsewhere_inside_the_window_are_not_zeroed():
    """FSDP2 with its gradient sync off keeps the window's gradients unsharded, off
    `param.grad`: zero after every backward but the last, and before every one."""
    variant = step(rank(losses=(0.25, 0.25), before=[0.0, 0.0], after=[0.0, 1.0]))
    d = diagnose_configurations(facts(BASE, variant, "model.params['w'].norm"))
    assert d is not None and d.rule == "configuration.unexplained"


@fires("configuration.clipped-in-window")
def test_gradients_scaled_down_between_two_backwards():
    variant = step(rank(losses=(0.25, 0.25), before=[0.0, 0.25], after=[1.0, 0.9]))
    d = diagnose_configurations(facts(BASE, variant, "model.params['w'].norm"))
    named(d, "configuration.clipped-in-window", CLIPPING_PER_MICRO_STEP, "scaled by 0.5", "once")


@fires("configuration.loss-not-scaled-by-accumulation")
@look_alike("configuration.clipped-in-window", "configuration.loss-not-scaled-by-accumulation")
def test_an_untouched_window_twice_the_baseline_is_the_accumulation_scale():
    base = step(rank(after=[1.0]))
    variant = step(rank(losses=(0.5, 0.5), after=[1.0, 4.0]))  # its norm twice the baseline's
    d = diagnose_configurations(facts(base, variant))
    named(
        d,
        "configuration.loss-not-scaled-by-accumulation",
        LOSS_NOT_SCALED_BY_ACCUMULATION,
        "2 times the baseline's",
        "divide each micro-batch's loss",
    )


@fires("configuration.clipped-by-own-shards")
def test_each_rank_scaling_its_shards_by_its_own_factor():
    variant = step(
        rank(after=[4.0], stepped=0.25, sharded=True),
        rank(after=[1.0], stepped=0.25, sharded=True, samples=(3, 4)),
    )
    d = diagnose_configurations(facts(BASE, variant, "gradient"))
    named(
        d,
        "configuration.clipped-by-own-shards",
        CLIPPING_ON_LOCAL_SHARDS,
        "rank 0 x0.25, rank 1 x0.5",
        "whole gradient's norm",
    )


@look_alike("configuration.clipped-by-own-shards", None)
def test_one_clipping_factor_on_every_rank_is_a_whole_gradient_clipping():
    variant = step(rank(after=[1.0], stepped=0.25), rank(after=[1.0], stepped=0.25, samples=(3, 4)))
    d = diagnose_configurations(facts(BASE, variant, "model.params['w'].norm"))
    assert d is not None and d.rule == "configuration.unexplained"


@fires("configuration.scheduler-per-micro-step")
def test_a_scheduler_counting_every_backward():
    base = step(rank(last_epochs={"lr_scheduler": 1}))
    variant = step(rank(losses=(0.2, 0.2, 0.2), last_epochs={"lr_scheduler": 3}))
    d = diagnose_configurations(facts(base, variant, SCHEDULED, LR))
    named(
        d,
        "configuration.scheduler-per-micro-step",
        SCHEDULER_PER_MICRO_STEP,
        "3 times fast",
        "step the LR scheduler once per optimizer step",
    )


@fires("configuration.scheduler-per-rank")
@look_alike("configuration.scheduler-per-micro-step", "configuration.scheduler-per-rank")
def test_a_scheduler_counting_every_rank():
    """accelerate steps a prepared scheduler once per process (split_batches=False)."""
    base = step(rank(losses=(0.25, 0.25), last_epochs={"lr_scheduler": 1}))
    variant = step(
        rank(last_epochs={"lr_scheduler": 2}), rank(samples=(3, 4), last_epochs={"lr_scheduler": 2})
    )
    d = diagnose_configurations(facts(base, variant, SCHEDULED, LR))
    named(
        d,
        "configuration.scheduler-per-rank",
        SCHEDULER_PER_RANK,
        "once per rank",
        "step_scheduler_with_optimizer=False",
    )
    assert d.cause.startswith("variant, step 1: lr_scheduler counted 2 steps where")


@look_alike("configuration.scheduler-per-rank", None)
@look_alike("configuration.scheduler-per-micro-step", None)
def test_a_scheduler_one_step_ahead_is_not_one_per_backward():
    base = step(rank(last_epochs={"lr_scheduler": 1}))
    variant = step(rank(losses=(0.2, 0.2, 0.2), last_epochs={"lr_scheduler": 2}))
    d = diagnose_configurations(facts(base, variant, SCHEDULED, LR))
    assert d is not None and d.rule == "configuration.unexplained"


BN = "model.buffers['norm.running_mean']"
SCHEDULED, LR = "watch:lr_scheduler.last_epoch", "watch:optimizer.lr"


@fires("configuration.scheduler-counter-only")
@look_alike("configuration.scheduler-per-rank", "configuration.scheduler-counter-only")
def test_a_counter_alone_with_equal_learning_rates_trains_the_same():
    """HF's no_trainer examples build accelerate's schedule for max_train_steps x processes:
    the counter runs twice as fast on 2 ranks, the learning rates are equal."""
    base = step(rank(losses=(0.25, 0.25), last_epochs={"lr_scheduler": 1}))
    variant = step(
        rank(last_epochs={"lr_scheduler": 2}), rank(samples=(3, 4), last_epochs={"lr_scheduler": 2})
    )
    d = diagnose_configurations(facts(base, variant, SCHEDULED))
    named(
        d,
        "configuration.scheduler-counter-only",
        SCHEDULER_COUNTER_ONLY,
        "only watch:lr_scheduler.last_epoch differs",
        'ignore=["watch:lr_scheduler.last_epoch"]',
    )


@look_alike("configuration.scheduler-counter-only", "configuration.loss-scaled-by-world-size")
def test_an_ignored_counter_is_evidence_of_nothing():
    """The counter left out by ignore=, the loss scaled by the world size is the cause."""
    base = step(rank(losses=(0.25, 0.25), after=[0.25, 1.0], samples=(1, 2, 3, 4)))
    base.ranks[0].last_epochs = {"lr_scheduler": 1}
    variant = step(
        rank(after=[4.0], last_epochs={"lr_scheduler": 2}),
        rank(after=[4.0], samples=(3, 4), last_epochs={"lr_scheduler": 2}),
    )
    found = facts(base, variant, "loss", LR, ignore=[SCHEDULED])
    d = diagnose_configurations(found)
    assert d is not None and d.rule == "configuration.loss-scaled-by-world-size", d.text()
    assert d.notes == []


@fires("configuration.per-rank-buffers")
def test_ranks_holding_buffers_of_their_own():
    variant = step(
        rank(samples=(1, 2), tensors={BN: {"norm": 1}}),
        rank(samples=(3, 4), tensors={BN: {"norm": 2}}),
    )
    d = diagnose_configurations(facts(BASE, variant, f"{BN}.norm"))
    named(d, "configuration.per-rank-buffers", PER_RANK_BATCH_STATISTICS, BN, "SyncBatchNorm")


@look_alike("configuration.per-rank-buffers", "configuration.same-data-on-every-rank")
def test_ranks_on_the_same_data_hold_the_same_buffers():
    variant = step(
        rank(samples=(1, 2), tensors={BN: {"norm": 1}}),
        rank(samples=(1, 2), tensors={BN: {"norm": 1}}),
    )
    d = diagnose_configurations(facts(BASE, variant, "samples consumed"))
    assert d is not None and d.rule == "configuration.same-data-on-every-rank"


@fires("configuration.token-mean-per-micro-batch")
def test_a_mean_of_micro_batch_token_means():
    # micro-batches of 30 and 10 tokens, token means 2.0 and 4.0: the global mean is 2.5
    base = step(rank(losses=(2.5,), tokens=[40.0]))
    variant = step(rank(losses=(1.0, 2.0), tokens=[30.0, 10.0]))
    d = diagnose_configurations(facts(base, variant))
    named(
        d,
        "configuration.token-mean-per-micro-batch",
        TOKEN_MEAN_PER_MICRO_BATCH,
        "tokens: 30, 10",
        "whole global batch",
    )


@look_alike("configuration.token-mean-per-micro-batch", None)
def test_token_counts_that_do_not_weigh_to_the_baseline_explain_nothing():
    base = step(rank(losses=(2.9,), tokens=[40.0], after=[1.0]))
    variant = step(rank(losses=(1.0, 2.0), tokens=[30.0, 10.0], after=[1.0, 1.1]))
    d = diagnose_configurations(facts(base, variant))
    assert d is not None and d.rule == "configuration.unexplained"


@fires("configuration.loss-not-scaled-by-accumulation")
def test_the_run_with_the_larger_window_gradient_is_named():
    """The baseline accumulates 2 and does not divide; the variant runs 2 ranks, 1 backward
    each: the baseline's gradient is twice the variant's, and the baseline is named."""
    base = step(rank(losses=(0.5, 0.5), after=[1.0, 4.0], samples=(1, 2, 3, 4)))
    variant = step(rank(after=[1.0]), rank(after=[1.0], samples=(3, 4)))
    d = diagnose_configurations(facts(base, variant))
    named(
        d,
        "configuration.loss-not-scaled-by-accumulation",
        LOSS_NOT_SCALED_BY_ACCUMULATION,
        "the baseline's window is 2 times the variant's, their ratio of backwards per step "
        "(2 against 1): the baseline's micro-batch losses are not divided",
        "divide each micro-batch's loss",
    )


@fires("configuration.loss-scaled-by-world-size")
def test_a_window_gradient_world_size_times_the_baseline():
    base = step(rank(after=[1.0], samples=(1, 2, 3, 4)))
    variant = step(rank(after=[4.0]), rank(after=[4.0], samples=(3, 4)))
    d = diagnose_configurations(facts(base, variant))
    named(
        d,
        "configuration.loss-scaled-by-world-size",
        LOSS_SCALED_BY_WORLD_SIZE,
        "their ratio of ranks (2 against 1)",
        "already average the gradients",
    )


@look_alike("configuration.loss-scaled-by-world-size", None)
@look_alike("configuration.loss-not-scaled-by-accumulation", None)
def test_a_ratio_both_the_accumulation_and_the_world_size_names_no_cause():
    base = step(rank(after=[1.0], samples=(1, 2, 3, 4)))
    two = dict(losses=(0.5, 0.5), after=[1.0, 4.0])
    variant = step(rank(**two), rank(**two, samples=(3, 4)))
    d = diagnose_configurations(facts(base, variant))
    named(d, "configuration.unexplained", UNKNOWN, "loss differs first, at step 1")


@fires("configuration.unexplained")
def test_a_difference_with_nothing_recorded_that_separates_a_cause():
    d = diagnose_configurations(facts(BASE, step(rank(samples=(1, 2, 3, 4)))))
    named(d, "configuration.unexplained", UNKNOWN, "cause unknown")


def test_equal_configurations_have_no_cause():
    found = facts(BASE, BASE)
    found.differences = []
    assert diagnose_configurations(found) is None


def test_other_causes_the_evidence_shows_are_said_beside_the_first():
    """accelerate's default on 2 ranks: the data order and the scheduler both follow the
    number of ranks; the samples, listed first, are the cause, the scheduler a note."""
    base = step(rank(losses=(0.25, 0.25), last_epochs={"lr_scheduler": 1}, samples=(1, 2, 3, 4)))
    variant = step(
        rank(last_epochs={"lr_scheduler": 2}, samples=(1, 5)),
        rank(samples=(6, 4), last_epochs={"lr_scheduler": 2}),
    )
    found = facts(base, variant, "samples consumed", SCHEDULED, LR)
    d = diagnose_configurations(found)
    assert d is not None and d.rule == "configuration.other-samples"
    (note,) = d.notes
    assert note.startswith(
        "also (scheduler per rank): variant, step 1: lr_scheduler counted 2 steps where the "
        "other configuration counted 1: it steps once per rank"
    )
