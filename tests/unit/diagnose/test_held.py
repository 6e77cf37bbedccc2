"""Stage.HELD: the first divergent step after a resume point that matched bit for bit. Only
causes that blame nothing audited answer there: the data rules (test_data.py), the
gradient-accumulation ones (asked in Stage.STEP too), and at last "computed differently"."""

import pytest

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
    point,
    restore,
    without_points,
)

COMPUTED = "held.computed-differently"
MICRO, WINDOW = "step.micro-batches", "step.accumulation-window"
LOST = "step.accumulation-window-lost"


# Never contradict the resume point (issue 30, item 3)


@fires(COMPUTED)
@pytest.mark.parametrize(
    "differs",
    [
        {"watch:opt.state": {"0": {"step": 4, "exp_avg": "other"}}},
        {"watch:model.buffers": {"bn.running_mean": {"hash": "other"}}},
        {"rng:cpu": "other"},
        {"watch:model.modes": ["drop"]},
    ],
    ids=["optimizer", "buffers", "cpu-rng", "modes"],
)
def test_an_object_that_matched_at_the_resume_point_is_never_blamed_on_its_restore(differs):
    """The gate held (every audited value equal at the same place); at step 4 the loss and an
    audited object differ: the first resumed step computed differently, nothing was restored
    wrong."""
    state = {"opt.state": {"0": {"step": 3, "exp_avg": "m3"}}, "opt.lr": [0.1]}
    state |= {"model.params": {"w": {"hash": "w3"}}, "model.buffers": {}, "model.modes": []}

    def base_values(step):
        return {"loss": 1.0, "rng:cpu": f"c{step}", "watch:opt.lr": [0.1]}

    def res_values(step):
        return {**base_values(step), "loss": 2.0, **(differs if step == 4 else {})}

    d = diagnosis(
        point(watch=state),
        point(watch=state, restores=2),
        [LOAD, restore("Optimizer.load_state_dict", "watch:opt")],
        base_values=base_values,
        res_values=res_values,
    )
    assert d.bug_class == "computed differently after an exact resume", d.text()
    assert "everything restored matched the uninterrupted run bit for bit" in d.text()
    assert "the first resumed step computed differently (loss)" in d.text()
    assert "gradient-accumulation buffers" in d.text() and d.text().count("Fix:") == 1
    for wrong in ("not saved", "not restored", "reset after loading", "was never"):
        assert wrong not in d.text()
    named(
        d,
        COMPUTED,
        "computed differently after an exact resume",
        "the difference is in state the audit did not see",
        "save and restore that state with the checkpoint",
    )


@look_alike(COMPUTED, wins="data.inputs-order")
def test_inputs_that_differ_at_the_first_step_are_never_computed_differently():
    """The gate-held rule: every audited value matched at the resume point, but the first
    resumed step was given other inputs. The inputs differ: a data-order cause from them."""
    base, res = auto_runs(lambda s: inputs(s - 1))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "step 4 consumed the batch of step 3 again" in d.text() and d.text().count("Fix:") == 1
    assert d.rule == "data.inputs-order"


# Gradient accumulation, in Stage.STEP and Stage.HELD


def accumulated(base_values, res_values, held):
    """Diagnose with equal resume points (`held`: the gate held), or none."""
    if held:
        return diagnosis(point(), point(), [LOAD], base_values, res_values)
    return without_points(base_values, res_values)


def per_backward(losses):
    """Recorded automatically: a loss per backward() of the step, and its inputs."""
    return lambda s: {"auto:loss": losses(s), "auto:data": [s * 10 + i for i in range(4)]}


@fires(MICRO)
@pytest.mark.parametrize("with_points", [True, False])
def test_an_optimizer_step_of_fewer_micro_batches_is_the_accumulation_counter(with_points):
    """Recorded automatically (a value per backward()): the resumed run's step 4 took one
    micro-batch where the uninterrupted run's took two, and every stream and watched object
    matched at the resume point: the micro-step counter was restored out of phase."""
    base_values = per_backward(lambda s: [s / 2, s / 3])
    res_values = per_backward(lambda s: [s / 2] if s == 4 else [s / 5, s / 7])
    d = accumulated(base_values, res_values, with_points)
    assert d.bug_class == "gradient accumulation"
    assert "took 1 micro-batch (backward calls) in the resumed run and 2" in d.text()
    assert "gradient-accumulation micro-step counter" in d.text()
    named(
        d,
        MICRO,
        "gradient accumulation",
        "so the resumed run accumulates out of phase",
        "save the micro-step counter, in micro-batches, with the checkpoint",
    )


@look_alike(MICRO, wins=COMPUTED)
def test_as_many_micro_batches_that_compute_otherwise_are_no_accumulation_phase():
    base_values = per_backward(lambda s: [s / 2, s / 3])
    res_values = per_backward(lambda s: [s / 5, s / 7])
    assert accumulated(base_values, res_values, held=True).rule == COMPUTED


TWO_MICRO_BATCHES = per_backward(lambda s: [s / 2, s / 3])


@fires(LOST)
@pytest.mark.parametrize("with_points", [True, False])
def test_a_first_step_that_took_the_last_of_its_micro_batches_lost_the_window(with_points):
    """Step 4 accumulates three micro-batches; the resumed run's step 4 took only the last
    two, bit for bit the uninterrupted run's: the first was done before the save, its
    gradients were not in the checkpoint."""
    base_values = per_backward(lambda s: [s / 2, s / 3, s / 5])
    res_values = per_backward(lambda s: [4 / 3, 4 / 5] if s == 4 else [s / 7, s / 9, s / 11])
    d = accumulated(base_values, res_values, with_points)
    named(
        d,
        LOST,
        "gradient accumulation",
        "the first resumed optimizer step took the last 2 of the 3 micro-batches the "
        "uninterrupted run accumulated for it (their losses match bit for bit): the "
        "accumulated gradients of the 1 micro-batch before the save were lost",
        "save only at an optimizer step (where the gradients are synchronized and zeroed",
    )
    assert d.cause.startswith("rank 0, step 4: ")


@look_alike(LOST, wins=MICRO)
@pytest.mark.parametrize(
    "first_losses",
    [[4 / 2], [4 / 3 + 1e-9], [9.0]],
    ids=["prefix", "suffix-not-bit-equal", "other-values"],
)
def test_fewer_micro_batches_that_are_not_the_windows_last_are_out_of_phase(first_losses):
    """The resumed step 4 took one micro-batch of the two: the first one (a counter out of
    phase, its window cut short), or another value: no window lost at the save."""
    res_values = per_backward(lambda s: first_losses if s == 4 else [s / 5, s / 7])
    d = accumulated(TWO_MICRO_BATCHES, res_values, held=True)
    assert d.rule == MICRO, d.text()
    assert "took 1 micro-batch (backward calls) in the resumed run and 2" in d.cause


@look_alike(LOST, wins=MICRO)
def test_the_last_micro_batches_of_a_later_step_are_no_window_lost_at_the_resume():
    """Step 4 matches; step 5 took the last of its micro-batches: not the first resumed step,
    so not the save's window."""
    res_values = per_backward(lambda s: [5 / 3] if s == 5 else [s / 2, s / 3])
    d = accumulated(TWO_MICRO_BATCHES, res_values, held=True)
    assert d.rule == MICRO, d.text()
    assert d.cause.startswith("rank 0, step 5: ")


def optimizer(count, lr):
    """An optimizer's learning rate and per-parameter step count, by step."""
    return lambda s: {"watch:opt.lr": [lr(s)], "watch:opt.state": {"0": {"step": count(s)}}}


def both(*parts):
    return lambda s: {k: v for part in parts for k, v in part(s).items()}


STEPPED_LESS = optimizer(lambda s: s - 1, lambda s: 0.1 * (s - 1))
"""The resumed optimizer stepped once less, and its scheduler with it."""


@fires(WINDOW)
@pytest.mark.parametrize("held", [True, False])
def test_an_optimizer_that_stepped_fewer_times_is_the_accumulation_window(held):
    base = both(lambda s: {"loss": 1.0}, optimizer(lambda s: s, lambda s: 0.1 * s))
    res = both(lambda s: {"loss": 2.0}, STEPPED_LESS)
    d = accumulated(base, res, held)
    named(
        d,
        WINDOW,
        "gradient accumulation",
        "the optimizer and the LR scheduler stepped a different number of times",
        "save the micro-step counter (and the accumulated gradients, or checkpoint only at an "
        "optimizer step)",
    )


@look_alike(WINDOW, wins=MICRO)
def test_fewer_micro_batches_explain_an_optimizer_that_stepped_fewer_times():
    base = both(per_backward(lambda s: [1.0, 2.0]), optimizer(lambda s: s, lambda s: 0.1 * s))
    res = both(per_backward(lambda s: [1.0]), STEPPED_LESS)
    assert accumulated(base, res, held=False).rule == MICRO


def restarted(count):
    """A scheduler counting from the resume, and an optimizer whose step counts are
    `count(step)`."""
    return both(
        lambda s: {"loss": 2.0, "watch:sched.last_epoch": s - SPLIT},
        optimizer(count, lambda s: 0.1 * (s - SPLIT)),
    )


@look_alike("step.lr-schedule-restarted", wins=WINDOW)
def test_an_optimizer_that_stepped_fewer_times_explains_a_schedule_counted_from_the_resume():
    base = both(
        lambda s: {"loss": 1.0, "watch:sched.last_epoch": s},
        optimizer(lambda s: s, lambda s: 0.1 * s),
    )
    assert accumulated(base, restarted(lambda s: s - SPLIT), held=False).rule == WINDOW
    # the optimizer's step counts the same: the schedule itself restarted
    assert (
        accumulated(base, restarted(lambda s: s), held=False).rule == "step.lr-schedule-restarted"
    )
