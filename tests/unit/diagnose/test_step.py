"""Stage.STEP, at the first divergent step when the resume point explains nothing (here: no
resume-point snapshot was taken, or the two were taken at different places): the random
streams, the learning rate, and the optimizer's and other watched objects' state. (The data
rules are in test_data.py; the accumulation ones, asked in Stage.HELD too, in test_held.py.)"""

import pytest

from pytest_resume_equiv.rank.encode import encode

from .builders import (
    LOAD,
    SPLIT,
    diagnosed,
    diagnosis,
    fires,
    look_alike,
    named,
    params,
    point,
    run,
    without_points,
)

SEEDED, OWNED = "step.generator-seeded-from-parent", "step.owned-generator"
COLLAPSED, CPU, DEVICE = "step.rng-collapsed", "step.cpu-rng", "step.device-rng"
NUMPY, PYTHON = "step.numpy-rng", "step.python-rng"
RESTARTED, SHIFTED, RATE = "step.lr-schedule-restarted", "step.lr-off-by-one", "step.lr-differs"
MODES, UNSEEN, WEIGHTS = (
    "step.train-eval-flags",
    "step.unaudited-input",
    "step.wrong-weights-loaded",
)
BUFFERS, MASTER = "step.buffers", "step.master-weights"
OPTIMIZER, WATCHED = "step.optimizer-state", "step.watched-object"
PARAMETERS, UNAUDITED = "step.parameters", "step.unaudited-state"

# Random streams

SAMPLER = "generator RandomSampler of the DataLoader built at train.py:12 #0"
GEN = "generator train.py:38 #0"
STREAMS = ("cpu", "cuda:0", "numpy", "python", SAMPLER, GEN)


def streams_differ(*differ):
    """Diagnose runs recording the loss and every stream of STREAMS, the resumed run's
    `differ` streams (and loss) other from step 4 on."""

    def values(resumed):
        def step(s):
            out = {"loss": 2.0 if resumed else 1.0}
            for name in STREAMS:
                out[f"rng:{name}"] = f"x{s}" if resumed and name in differ else f"{name}{s}"
            return out

        return step

    return without_points(values(False), values(True))


@pytest.mark.parametrize(
    ("differ", "rule", "bug_class", "words", "fix"),
    [
        pytest.param(
            [SAMPLER],
            SEEDED,
            "cpu RNG before the iterator started",
            "the generator the RandomSampler of the DataLoader built at train.py:12 makes "
            "whenever an iterator starts differs while the CPU RNG",
            "restore the CPU RNG (torch's default generator) to the state saved before the "
            "epoch's iterator started (torch.get_rng_state() / torch.set_rng_state())",
            id="sampler",
        ),
        pytest.param(
            [GEN],
            OWNED,
            "owned generator",
            "the generator created at train.py:38 #0 differs while the CPU and device "
            "generators match",
            "generator.get_state() / generator.set_state()",
            id="owned",
        ),
        pytest.param(
            ["cpu"],
            CPU,
            "cpu RNG",
            "the CPU RNG (torch's default generator) differs: it was not restored",
            "save torch.get_rng_state() with the checkpoint and torch.set_rng_state() it",
            id="cpu",
        ),
        pytest.param(
            ["cuda:0"],
            DEVICE,
            "device RNG",
            "the cuda RNG of device cuda:0 differs",
            "save torch.cuda.get_rng_state_all() and restore every device's",
            id="device",
        ),
        pytest.param(
            ["numpy"],
            NUMPY,
            "numpy RNG",
            "numpy's global RNG differs",
            "save np.random.get_state() with the checkpoint and np.random.set_state() it",
            id="numpy",
        ),
        pytest.param(
            ["python"],
            PYTHON,
            "python RNG",
            "Python's random module differs",
            "save random.getstate() with the checkpoint and random.setstate() it",
            id="python",
        ),
    ],
)
@fires(SEEDED, OWNED, CPU, DEVICE, NUMPY, PYTHON)
def test_a_stream_that_differs_at_the_step(differ, rule, bug_class, words, fix):
    named(streams_differ(*differ), rule, bug_class, words, fix)


@pytest.mark.parametrize(
    ("differ", "wins"),
    [
        pytest.param([SAMPLER, GEN], OWNED, id="sampler-beside-an-owned-generator"),
        pytest.param([GEN, "cpu"], CPU, id="owned-generator-beside-the-cpu"),
        pytest.param(["cuda:0", "cpu"], CPU, id="device-beside-the-cpu"),
        pytest.param(["numpy", "cuda:0"], DEVICE, id="numpy-beside-a-device"),
        pytest.param(["python", "numpy"], NUMPY, id="python-beside-numpy"),
    ],
)
@look_alike(SEEDED, wins=OWNED)
@look_alike(OWNED, wins=CPU)
@look_alike(DEVICE, wins=CPU)
@look_alike(NUMPY, wins=DEVICE)
@look_alike(PYTHON, wins=NUMPY)
def test_of_two_streams_that_differ_the_one_asked_first_is_named(differ, wins):
    """A generator re-derived from the CPU RNG is named only when every differing generator
    is; an owned generator only while the global streams match; then torch's CPU stream, the
    devices', numpy's, Python's."""
    assert streams_differ(*differ).rule == wins


def two_ranks(rank_1_cpu):
    """Rank 1 resumes with the CPU RNG `rank_1_cpu(step)`, rank 0 with its own."""

    def own(r):
        return lambda s: {"loss": 1.0, "rng:cpu": f"r{r}s{s}"}

    base = {r: run("uninterrupted", range(1, 7), own(r), rank=r) for r in (0, 1)}
    resumed = {0: own(0), 1: lambda s: {"loss": 1.0, "rng:cpu": rank_1_cpu(s)}}
    res = {r: run("resumed", range(4, 7), resumed[r], rank=r) for r in (0, 1)}
    return diagnosed(base, res)


@fires(COLLAPSED)
@look_alike(CPU, wins=COLLAPSED)
def test_a_rank_resumed_with_another_ranks_stream_collapsed():
    d = two_ranks(lambda s: f"r0s{s}")
    named(
        d,
        COLLAPSED,
        "per-rank RNG collapsed",
        "after the resume, rank 1's cpu RNG state equals rank 0's",
        "save each rank's own state, keyed by its global rank, not its local rank",
    )


@look_alike(COLLAPSED, wins=CPU)
def test_a_rank_resumed_with_no_ranks_stream_is_the_stream_not_restored():
    d = two_ranks(lambda s: f"zz{s}")
    assert d.rule == CPU and d.cause.startswith("rank 1, step 4: the CPU RNG"), d.text()


# The learning rate


def lr_runs(res_lr, res_epoch=None):
    """The scheduler's learning rate (0.1 x step in the uninterrupted run, `res_lr(step)` in
    the resumed one) per step, and its count when `res_epoch(step)` is given."""

    def values(loss, rate, epoch):
        def step(s):
            out = {"loss": loss, "watch:sched.last_lr": [rate(s)]}
            return out | ({"watch:sched.last_epoch": epoch(s)} if res_epoch else {})

        return step

    return without_points(
        values(1.0, lambda s: 0.1 * s, lambda s: s), values(2.0, res_lr, res_epoch)
    )


@fires(RESTARTED)
@pytest.mark.parametrize("warmup", [True, False])
def test_a_restarted_schedule_is_a_restarted_warmup_only_when_it_warms_up(warmup):
    def lr(step):
        return 0.1 * step if warmup else 0.1 / step

    def values(step, at):
        return {"loss": 1.0, "watch:sched.last_lr": [lr(at)], "watch:sched.last_epoch": at}

    d = without_points(lambda s: values(s, s), lambda s: values(s, s - SPLIT))
    assert d.bug_class == "LR scheduler missing"
    assert ("warmup" in d.text()) is warmup
    assert d.text().count("Fix:") == 1 and "Fix: save scheduler.state_dict()" in d.text()
    named(
        d,
        RESTARTED,
        "LR scheduler missing",
        "the scheduler counts its steps from the resume, not from the start",
        "save scheduler.state_dict() with the checkpoint",
    )


@fires(SHIFTED)
@look_alike(RATE, wins=SHIFTED)
@pytest.mark.parametrize("counted", [False, True], ids=["rate-only", "with-its-count"])
def test_a_learning_rate_of_the_next_step_is_off_by_one(counted):
    d = lr_runs(lambda s: 0.1 * (s + 1), (lambda s: s + 1) if counted else None)
    named(
        d,
        SHIFTED,
        "LR scheduler off by one",
        "the learning rate is shifted by one step",
        "save the scheduler after its step; do not step it after load_state_dict",
    )


@look_alike(SHIFTED, wins=RESTARTED)
def test_a_count_from_the_resume_is_a_restart_not_a_shift():
    """The rate of another step, and a scheduler that counts its steps from the resume: the
    schedule restarted (a count one off would be the shift)."""
    d = lr_runs(lambda s: 0.1 * (s - SPLIT), lambda s: s - SPLIT)
    assert d.rule == RESTARTED, d.text()


@fires(RATE)
def test_a_learning_rate_of_no_step_differs():
    d = lr_runs(lambda s: 0.77)
    named(
        d,
        RATE,
        "LR scheduler missing",
        "the learning rate differs (sched.last_lr) before any other watched state explains it",
        "save scheduler.state_dict() with the checkpoint",
    )


# Train/eval flags, and the weights at the first resumed step


@fires(MODES)
def test_train_eval_flags_that_differ_at_the_step():
    d = without_points(
        lambda s: {"loss": 1.0, "watch:model.modes": []},
        lambda s: {"loss": 2.0, "watch:model.modes": ["drop"]},
    )
    named(
        d,
        MODES,
        "train/eval flags",
        "module train/eval flags differ (drop in eval mode in one run only)",
        "call model.train() after loading",
    )


@look_alike(MODES, wins="data.ids-order")
def test_other_samples_come_before_the_train_eval_flags():
    d = without_points(
        lambda s: {"loss": 1.0, "ids": [s], "watch:model.modes": []},
        lambda s: {"loss": 2.0, "ids": [s + 10], "watch:model.modes": ["drop"]},
    )
    assert d.rule == "data.ids-order", d.text()


def first_step_weights(res_point=None, buffers=False):
    """The loss and the module's parameters differ from the first resumed step on; the
    resume points (when given) hold the same parameters."""

    def values(loss, shift):
        def step(s):
            out = {"loss": loss, "watch:model.params": params(s + shift)}
            return out | ({"watch:model.buffers": {"rm": f"{shift}{s}"}} if buffers else {})

        return step

    if res_point is None:
        return without_points(values(1.0, 0), values(2.0, 10))
    watch = {"model.params": params(3)}
    return diagnosis(point(watch=watch), res_point(watch), [LOAD], values(1.0, 0), values(2.0, 10))


ELSEWHERE = "first forward of Net at train.py:31"
"""The resumed run's snapshot taken at another place: it explains nothing, the step decides."""


@fires(UNSEEN)
@look_alike(WEIGHTS, wins=UNSEEN)
def test_weights_that_matched_at_the_resume_point_blame_an_unseen_input():
    d = first_step_weights(lambda watch: point(watch=watch, restores=1, at=ELSEWHERE))
    named(
        d,
        UNSEEN,
        "unaudited input",
        "at the resume point the weights and every audited RNG stream match the uninterrupted "
        "run, yet loss already differ at the first resumed step",
        "record the batch's content (e.g. x=batch) or watch() the object",
    )


@fires(WEIGHTS)
@look_alike(UNSEEN, wins=WEIGHTS)
def test_weights_that_differ_at_the_first_step_without_a_resume_point_are_the_wrong_ones():
    d = first_step_weights()
    named(
        d,
        WEIGHTS,
        "torn checkpoint",
        "the recorded values (loss) and parameters (w) already differ at the first resumed step",
        "load the checkpoint saved at the split, and finish (or copy the state of) a save",
    )


# Watched state at the step


def state_differs(base, res):
    """`base(step)` / `res(step)`: the watched values besides a loss of 1.0."""
    return without_points(lambda s: {"loss": 1.0, **base(s)}, lambda s: {"loss": 1.0, **res(s)})


def buffer(tag):
    return lambda s: {"watch:model.buffers": {"rm": f"{tag}{s}"}}


def master(gap):
    """An optimizer's own copies of the parameters, `gap` off the uninterrupted run's."""
    return lambda s: {
        "watch:opt.lr": [0.1],
        "watch:opt.params": {
            "group0.0": {"hash": f"h{s}{gap}", "norm": encode(1.0 + s + gap, "n")}
        },
    }


def moments(tag):
    return lambda s: {"watch:opt.lr": [0.1], "watch:opt.state": {"0": {"exp_avg": f"{tag}{s}"}}}


def ema(n):
    return lambda s: {"watch:ema.state": {"n": n(s)}}


def module(shift):
    return lambda s: {"watch:model.params": params(s + shift)}


def both(*parts):
    return lambda s: {k: v for part in parts for k, v in part(s).items()}


@pytest.mark.parametrize(
    ("base", "res", "rule", "bug_class", "words", "fix"),
    [
        pytest.param(
            buffer("a"),
            buffer("b"),
            BUFFERS,
            "buffers",
            "buffer rm of model differs",
            "save and load the whole state_dict(), buffers included",
            id="buffers",
        ),
        pytest.param(
            master(0),
            master(0.001),
            MASTER,
            "master weights",
            "the optimizer's own copies of the parameters (master weights) differ only at "
            "rounding level",
            "save the optimizer's fp32 master weights and load them back",
            id="master-weights",
        ),
        pytest.param(
            moments("m"),
            moments("z"),
            OPTIMIZER,
            "optimizer state",
            "the optimizer state differs (0)",
            "save optimizer.state_dict() after the optimizer step",
            id="optimizer-state",
        ),
        pytest.param(
            ema(lambda s: s),
            ema(lambda s: 0),
            WATCHED,
            "watched state",
            "the watched object 'ema' differs (state n)",
            "save 'ema''s state_dict() after the step that ends at the split",
            id="watched-object",
        ),
        pytest.param(
            module(0),
            module(10),
            PARAMETERS,
            "optimizer state",
            "parameters differ (w) although the recorded values matched",
            "save optimizer.state_dict() after the optimizer step",
            id="parameters",
        ),
    ],
)
@fires(BUFFERS, MASTER, OPTIMIZER, WATCHED, PARAMETERS)
def test_watched_state_that_differs_at_the_step(base, res, rule, bug_class, words, fix):
    named(state_differs(base, res), rule, bug_class, words, fix)


@pytest.mark.parametrize(
    ("base", "res", "wins"),
    [
        pytest.param(both(master(0), buffer("a")), both(master(0.001), buffer("b")), BUFFERS),
        pytest.param(both(master(0), moments("m")), both(master(0.001), moments("z")), MASTER),
        pytest.param(
            both(moments("m"), ema(lambda s: s)), both(moments("z"), ema(lambda s: 0)), OPTIMIZER
        ),
        pytest.param(
            both(module(0), ema(lambda s: s)), both(module(10), ema(lambda s: 0)), WATCHED
        ),
    ],
    ids=[
        "master-weights-beside-buffers",
        "moments-beside-master-weights",
        "ema-beside-moments",
        "parameters-beside-an-ema",
    ],
)
@look_alike(MASTER, wins=BUFFERS)
@look_alike(OPTIMIZER, wins=MASTER)
@look_alike(WATCHED, wins=OPTIMIZER)
@look_alike(PARAMETERS, wins=WATCHED)
def test_of_two_watched_states_that_differ_the_one_asked_first_is_named(base, res, wins):
    """Buffers, then the optimizer's master weights, its state, other watched objects (an EMA
    follows the model, so the optimizer first), and parameters with nothing else last."""
    assert state_differs(base, res).rule == wins


@look_alike(BUFFERS, wins=WEIGHTS)
def test_buffers_beside_weights_wrong_at_the_first_step_are_the_weights():
    assert first_step_weights(buffers=True).rule == WEIGHTS


@fires(UNAUDITED)
def test_recorded_values_that_differ_with_nothing_audited_are_unaudited_state():
    d = without_points(lambda s: {"loss": 1.0}, lambda s: {"loss": 2.0})
    named(
        d,
        UNAUDITED,
        "unaudited state",
        "recorded values differ (loss) while every audited RNG stream and watched state matches",
        "save and restore that state; record its inputs or watch() it",
    )


@look_alike(UNAUDITED, wins=OPTIMIZER)
def test_recorded_values_beside_an_optimizers_moments_are_the_moments():
    d = without_points(
        lambda s: {"loss": 1.0, **moments("m")(s)}, lambda s: {"loss": 2.0, **moments("z")(s)}
    )
    assert d.rule == OPTIMIZER, d.text()
