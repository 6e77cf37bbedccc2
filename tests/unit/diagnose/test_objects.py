"""Stage.OBJECT: one watched object (module, optimizer, LR scheduler, data loader, any other)
that differs at the resume point, read with the restore log."""

import pytest

from pytest_resume_equiv.rank.encode import encode

from .builders import (
    DCP_LOAD,
    LOAD,
    diagnosed,
    diagnosis,
    fires,
    look_alike,
    named,
    params,
    point,
    restore,
    run,
)

ID = "resume.object."
FROM_OTHER_RANK, LOADER = ID + "from-another-rank", ID + "loader-parts"
NEVER = {kind: f"{ID}{kind}-never-restored" for kind in ("module", "optimizer", "scheduler")}
LATER, EARLIER = ID + "from-a-later-step", ID + "from-an-earlier-step"
PARTIAL, PRECISION = ID + "optimizer-state-partial", ID + "restored-at-reduced-precision"
OFF_BY_ONE, BUFFERS = ID + "scheduler-off-by-one", ID + "buffers-left-out"
WRONG = ID + "restored-wrong"

MODULE_LOAD = restore("Module.load_state_dict", "watch:model")
OPTIMIZER_LOAD = restore("Optimizer.load_state_dict", "watch:optimizer")
SCHEDULER_LOAD = restore("LRScheduler.load_state_dict", "watch:scheduler")
OPT = {"optimizer.lr": [0.1], "optimizer.hyper": [{}], "optimizer.params": {}}
MASTER = {"optimizer.lr": [0.1], "optimizer.hyper": [{}], "optimizer.state": {"w": {"step": 3}}}


def master(norm):
    """An optimizer whose own copies of the parameters have norm `norm`."""
    return {
        **MASTER,
        "optimizer.params": {"group0.0": {"hash": str(norm), "norm": encode(norm, "n")}},
    }


@fires(*NEVER.values(), PARTIAL, OFF_BY_ONE, BUFFERS, PRECISION, WRONG, LOADER)
@pytest.mark.parametrize(
    ("base_watch", "res_watch", "log", "rule", "bug_class", "words", "fix"),
    [
        pytest.param(
            {**OPT, "optimizer.state": {"w": {"step": 3, "exp_avg": "a"}}},
            {**OPT, "optimizer.state": {"w": {}}},
            [LOAD],
            NEVER["optimizer"],
            "optimizer never restored",
            "the optimizer 'optimizer' was never restored",
            "save and load its state_dict()",
            id="optimizer-never-restored",
        ),
        pytest.param(
            {**OPT, "optimizer.state": {"w": {"step": 3, "exp_avg": "a"}}},
            {**OPT, "optimizer.state": {"w": {}}},
            [LOAD, OPTIMIZER_LOAD],
            PARTIAL,
            "optimizer state missing",
            "is missing or partial at the resume point (no entries for w)",
            "save and load optimizer.state_dict(), after the optimizer step",
            id="optimizer-state-partial",
        ),
        pytest.param(
            {"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3},
            {"scheduler.last_lr": [0.2], "scheduler.last_epoch": 4},
            [LOAD, SCHEDULER_LOAD],
            OFF_BY_ONE,
            "LR scheduler off by one",
            "is one step ahead at the resume point",
            "save the scheduler after its step; do not step it after load_state_dict",
            id="scheduler-off-by-one",
        ),
        pytest.param(
            {"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3},
            {"scheduler.last_lr": [0.2], "scheduler.last_epoch": 0},
            [LOAD],
            NEVER["scheduler"],
            "scheduler never restored",
            "warmup restarts",
            "save and load its state_dict()",
            id="scheduler-never-restored",
        ),
        pytest.param(
            {
                "model.params": {"w": {"hash": "a", "norm": encode(1.0, "n")}},
                "model.buffers": {"rm": "a"},
                "model.modes": [],
            },
            {
                "model.params": {"w": {"hash": "a", "norm": encode(1.0, "n")}},
                "model.buffers": {"rm": "b"},
                "model.modes": [],
            },
            [LOAD, MODULE_LOAD],
            BUFFERS,
            "buffers",
            "buffer rm differs at the resume point",
            "save and load the whole state_dict(), buffers included",
            id="buffers-left-out",
        ),
        pytest.param(
            {"model.params": {"w": {"hash": "a", "norm": encode(1.0, "n")}}, "model.modes": []},
            {"model.params": {"w": {"hash": "b", "norm": encode(1.001, "n")}}, "model.modes": []},
            [LOAD, MODULE_LOAD],
            PRECISION,
            "restored at reduced precision",
            "differ only at low-precision rounding level",
            "save the fp32 master weights instead of rebuilding them",
            id="module-at-reduced-precision",
        ),
        pytest.param(
            master(1.0),
            master(1.001),
            [LOAD, OPTIMIZER_LOAD],
            PRECISION,
            "restored at reduced precision",
            "the optimizer's own copies of the parameters ('optimizer': master weights)",
            "save the fp32 master weights instead of rebuilding them",
            id="master-weights-at-reduced-precision",
        ),
        pytest.param(
            {"ema.state": {"n": 3}},
            {"ema.state": {"n": 0}},
            [LOAD],
            WRONG,
            "watched state",
            "'ema' differs from the uninterrupted run's at the resume point (ema.state n)",
            "save 'ema''s state_dict() after the step that ends at the split",
            id="restored-wrong",
        ),
        pytest.param(
            {"model.params": params(3), "model.modes": []},
            {"model.params": params(0), "model.modes": []},
            [LOAD],
            NEVER["module"],
            "module never restored",
            "the module 'model' was never restored (no load_state_dict call restored it)",
            "save and load its state_dict()",
            id="module-never-restored",
        ),
        pytest.param(
            {"loader.epoch": 1, "loader.position": {"batches": 3}},
            {"loader.epoch": 0, "loader.position": {"batches": 0}},
            [LOAD],
            LOADER,
            "data loader state",
            "its epoch (uninterrupted 1, resumed 0), its position in the epoch (batches: "
            "uninterrupted 3, resumed 0) differ at the resume point",
            "restore the sampler's epoch (set_epoch(saved_epoch) on the loader made after",
            id="loader-parts",
        ),
    ],
)
def test_objects_at_the_resume_point(base_watch, res_watch, log, rule, bug_class, words, fix):
    d = diagnosis(point(watch=base_watch), point(watch=res_watch, restores=len(log)), log)
    assert d.bug_class == bug_class, d.text()
    assert words in d.text()
    named(d, rule, bug_class, words, fix)


@look_alike(NEVER["optimizer"], wins=PARTIAL)
@look_alike(PARTIAL, wins=NEVER["optimizer"])
def test_an_optimizer_without_its_state_is_never_restored_or_partial_by_its_restore_log():
    """The same state at the resume point: with no load_state_dict call for the optimizer it
    was never restored; with one, what it restored is partial."""
    base = point(watch={**OPT, "optimizer.state": {"w": {"step": 3, "exp_avg": "a"}}})
    res = {**OPT, "optimizer.state": {"w": {}}}
    never = diagnosis(base, point(watch=res, restores=1), [LOAD])
    partial = diagnosis(base, point(watch=res, restores=2), [LOAD, OPTIMIZER_LOAD])
    assert (never.rule, partial.rule) == (NEVER["optimizer"], PARTIAL)


@look_alike(NEVER["scheduler"], wins=OFF_BY_ONE)
@look_alike(OFF_BY_ONE, wins=NEVER["scheduler"])
def test_a_scheduler_one_step_ahead_is_off_by_one_only_when_it_was_restored():
    base = point(watch={"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3})
    res = {"scheduler.last_lr": [0.2], "scheduler.last_epoch": 4}
    restored = diagnosis(base, point(watch=res, restores=2), [LOAD, SCHEDULER_LOAD])
    never = diagnosis(base, point(watch=res, restores=1), [LOAD])
    assert (restored.rule, never.rule) == (OFF_BY_ONE, NEVER["scheduler"])


@look_alike(OFF_BY_ONE, wins=WRONG)
def test_a_scheduler_two_steps_ahead_is_no_off_by_one():
    base = point(watch={"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3})
    res = point(watch={"scheduler.last_lr": [0.2], "scheduler.last_epoch": 5}, restores=2)
    d = diagnosis(base, res, [LOAD, SCHEDULER_LOAD])
    named(
        d,
        WRONG,
        "watched state",
        "'scheduler' (restored by LRScheduler.load_state_dict at train.py:20) differs",
        "save 'scheduler''s state_dict() after the step that ends at the split",
    )


@look_alike(BUFFERS, wins=WRONG)
@look_alike(WRONG, wins=BUFFERS)
def test_buffers_are_left_out_only_when_the_weights_were_restored():
    def module(weights, buffer):
        return {"model.params": params(weights), "model.buffers": {"rm": buffer}, "model.modes": []}

    base = point(watch=module(3, "a"))
    left_out = diagnosis(base, point(watch=module(3, "b"), restores=2), [LOAD, MODULE_LOAD])
    both = diagnosis(base, point(watch=module(9, "b"), restores=2), [LOAD, MODULE_LOAD])
    assert (left_out.rule, both.rule) == (BUFFERS, WRONG)
    assert "(model.buffers rm): its state was not restored as saved" in both.cause


@look_alike(PRECISION, wins=WRONG)
def test_weights_that_differ_beyond_rounding_are_no_reduced_precision():
    base = point(watch={"model.params": {"w": {"hash": "a", "norm": encode(1.0, "n")}}})
    res = point(watch={"model.params": {"w": {"hash": "b", "norm": encode(1.5, "n")}}}, restores=2)
    d = diagnosis(base, res, [LOAD, MODULE_LOAD])
    assert d.rule == WRONG, d.text()


@look_alike(PRECISION, wins=PARTIAL)
def test_an_optimizer_state_missing_comes_before_its_master_weights_rounding():
    res = {**master(1.001), "optimizer.state": {"w": {}}}
    d = diagnosis(point(watch=master(1.0)), point(watch=res, restores=2), [LOAD, OPTIMIZER_LOAD])
    assert d.rule == PARTIAL, d.text()


@look_alike(NEVER["module"], wins=WRONG)
def test_a_module_is_never_called_unrestored_after_a_load_that_writes_tensors_in_place():
    """DCP's load restores weights in place, unlogged: no load_state_dict call for the module
    does not make it never restored."""
    base = point(watch={"model.params": params(3), "model.modes": []})
    res = point(watch={"model.params": params(0), "model.modes": []}, restores=1)
    d = diagnosis(base, res, [DCP_LOAD])
    named(
        d,
        WRONG,
        "watched state",
        "'model' differs from the uninterrupted run's at the resume point (model.params w)",
        "save 'model''s state_dict()",
    )


@fires(NEVER["scheduler"])
def test_a_scheduler_is_never_restored_by_a_load_that_writes_tensors_in_place():
    """DCP restores weights and optimizer moments in place, unlogged; a scheduler's counters
    it cannot: with no load_state_dict call for it, it was never restored (issue 40)."""
    base = point(watch={"lr_scheduler.last_lr": [0.1], "lr_scheduler.last_epoch": 3})
    res = point(watch={"lr_scheduler.last_lr": [0.2], "lr_scheduler.last_epoch": 0}, restores=1)
    d = diagnosis(base, res, [DCP_LOAD])
    assert d.bug_class == "scheduler never restored", d.text()
    assert "the LR scheduler 'lr_scheduler' was never restored" in d.text()
    assert d.text().count("Fix:") == 1
    assert d.rule == NEVER["scheduler"]


# Another step's state


def model_equal_to(step, log):
    """The module at the resume point equals the uninterrupted run's after `step`, and the
    resumed run goes on from there."""

    def base_values(s):
        return {"loss": 1.0, "rng:cpu": "c", "watch:model.params": params(s)}

    base = point(watch={"model.params": params(3), "model.modes": []})
    res = point(watch={"model.params": params(step), "model.modes": []}, restores=len(log))
    return diagnosis(
        base,
        res,
        log,
        base_values=base_values,
        res_values=lambda s: {**base_values(s + step - 3), "loss": 2.0},
    )


@fires(LATER)
def test_weights_that_equal_a_later_step_are_a_torn_checkpoint():
    d = model_equal_to(4, [LOAD, MODULE_LOAD])
    assert d.bug_class == "torn checkpoint"
    assert "holds 'model' (its parameters) as it was after step 4" in d.text()
    assert "a staging race" in d.text()
    named(
        d,
        LATER,
        "torn checkpoint",
        "its contents are from a later step than it claims",
        "copy the state when the save starts",
    )


@fires(EARLIER)
def test_weights_that_equal_an_earlier_step_are_an_older_checkpoint():
    d = model_equal_to(2, [LOAD, MODULE_LOAD])
    named(
        d,
        EARLIER,
        "restored from another step",
        "'model' at the resume point is the uninterrupted run's state after step 2, not step 3: "
        "an older checkpoint was loaded",
        "load the checkpoint saved at the split",
    )


@look_alike(LATER, wins=NEVER["module"])
@look_alike(EARLIER, wins=NEVER["module"])
@pytest.mark.parametrize("step", [2, 4])
def test_weights_of_another_step_that_nothing_restored_were_never_restored(step):
    d = model_equal_to(step, [LOAD])
    assert d.rule == NEVER["module"], d.text()


@fires(LATER)
def test_optimizer_state_from_the_next_step_is_named_a_staging_race():
    """pytorch#144657: the checkpoint of step 3 holds the optimizer's moments of step 4 beside
    step 3's parameters."""

    def state(step):
        return {"0": {"step": step, "exp_avg": f"m{step}"}}

    def base_values(step):
        return {"loss": 1.0, "watch:opt.state": state(step), "watch:opt.lr": [0.1]}

    optimizer = {"opt.state": state(3), "opt.lr": [0.1]}
    base = point(watch=optimizer)
    res = point(watch={**optimizer, "opt.state": state(4)}, restores=2)
    log = [LOAD, restore("Optimizer.load_state_dict", "watch:opt")]
    d = diagnosis(
        base,
        res,
        log,
        base_values=base_values,
        res_values=lambda s: {**base_values(s + 1), "loss": 2.0},
    )
    assert d.bug_class == "torn checkpoint"
    assert "holds 'opt' (its state (moments, step counts)) as it was after step 4" in d.text()
    assert "contents are from a later step than it claims, a staging race" in d.text()
    assert d.rule == LATER


# Another rank's state


def two_ranks(watch, rank_1_restored, log=(LOAD, MODULE_LOAD)):
    """Two ranks: `watch(r)` is what rank r saved; rank 1 resumed holding `rank_1_restored`,
    rank 0 its own."""

    def values(r, shift):
        return lambda s: {"loss": 1.0 + s + shift * r}

    base = {
        r: run("uninterrupted", range(1, 7), values(r, 0), rank=r, points=[point(watch=watch(r))])
        for r in (0, 1)
    }
    res = {
        r: run(
            "resumed",
            range(4, 7),
            values(r, 0.5),
            rank=r,
            points=[point(watch=rank_1_restored if r else watch(0), restores=len(log))],
            restores=list(log),
        )
        for r in (0, 1)
    }
    return diagnosed(base, res)


def model_of(r):
    return {"model.params": {"w": {"hash": f"r{r}"}}, "model.modes": []}


@fires(FROM_OTHER_RANK)
def test_a_rank_holding_another_ranks_saved_module():
    d = two_ranks(model_of, model_of(0))
    named(
        d,
        FROM_OTHER_RANK,
        "restored from another rank",
        "rank 1: at the resume point watch:model.params equals rank 0's saved state",
        "save each rank's own state, keyed by its global rank",
    )


@look_alike(FROM_OTHER_RANK, wins=WRONG)
def test_a_rank_holding_no_ranks_saved_module_was_restored_wrong():
    d = two_ranks(model_of, {"model.params": {"w": {"hash": "zz"}}, "model.modes": []})
    assert d.rule == WRONG and d.cause.startswith("rank 1: 'model'"), d.text()


@look_alike(LOADER, wins=FROM_OTHER_RANK)
def test_a_loader_holding_another_ranks_position_was_restored_from_that_rank():
    """Rank 0's loader state saved for every rank: the parts differ on rank 1, and what it
    holds is rank 0's."""

    def loader_of(r):
        return {"loader.epoch": 1, "loader.position": {"batches": 3 + r}}

    d = two_ranks(loader_of, loader_of(0), log=[LOAD])
    assert d.rule == FROM_OTHER_RANK, d.text()
    assert "watch:loader.position equals rank 0's saved state" in d.cause


@look_alike(FROM_OTHER_RANK, wins=WRONG)
def test_an_object_neither_the_resumed_rank_nor_another_holds_is_no_other_ranks_state():
    """Rank 1 alone watched an EMA in the uninterrupted run, and its resumed run holds none at
    the resume point: no state there to equal rank 0's, which saved none either."""
    d = two_ranks(lambda r: {"ema.state": {"n": 3}} if r else {}, {}, log=[LOAD])
    assert d.rule == WRONG and d.cause.startswith("rank 1: 'ema' differs"), d.text()
