"""The causes the checks other than the plain resume ask for, through `cause(stage, input)`,
each from the facts its check measured: Stage.SOURCE (a chain link that restored exactly
what its writer held), Stage.TOPOLOGY (a resume on another number of ranks), Stage.CRASH (a
resume after a crash inside the save), Stage.FRESH_PROCESS (a resumed process computing its
first step otherwise) and Stage.NOISE (a trajectory judged against measured noise)."""

from test_topology import global_ids, judge
from test_topology import run as topology_run

from pytest_resume_equiv.compare.comparators import NOISE_FACTOR
from pytest_resume_equiv.compare.diff import Comparison, Divergence, compare_runs
from pytest_resume_equiv.compare.gate import GateFacts
from pytest_resume_equiv.diagnose import Stage, cause
from pytest_resume_equiv.diagnose.at_check import CrashedAt, Judged

from .builders import SPLIT, STEPS, fires, look_alike, named, run

SOURCE = "source.saved-wrong-by-its-writer"
TOPOLOGY_DATA, TOPOLOGY_VALUES = "topology.data-not-equivalent", "topology.values-beyond-noise"
CRASH, NOISE = "crash.torn-by-the-crash", "noise.beyond-measured-noise"
FRESH = "fresh-process.rounding-level"
THROUGHOUT = "fresh-process.rounding-level-throughout"

WRITER = "the launch of split 2"
HELD_AGAINST_WRITER = GateFacts("held", reference=WRITER, at="train.py:50")
"""The resumed run's resume point equals, bit for bit, what the launch that wrote its
checkpoint held there."""
FAILED = GateFacts("failed", differing={"0": ["watch:model.params", "rng:cpu"]}, at="train.py:50")


@fires(SOURCE)
def test_a_state_restored_exactly_from_a_writer_that_held_it_wrong_was_saved_wrong():
    d = cause(Stage.SOURCE, (HELD_AGAINST_WRITER, FAILED))
    named(
        d,
        SOURCE,
        "saved wrong by the launch that wrote it",
        f"the resumed run restored exactly what {WRITER} held at the split",
        "take each object's state_dict() when saving",
    )
    assert "(watch:model.params, rng:cpu)" in d.cause and d.evidence["writer"] == WRITER


@look_alike(SOURCE, wins=None)
def test_a_state_not_restored_as_its_writer_held_it_or_right_after_all_is_no_saved_wrong():
    """Not restored exactly (the resume's own restore is to blame, the ordinary diagnosis
    says how), or equal to the uninterrupted run's too: nothing saved wrong."""
    not_restored = GateFacts("failed", reference=WRITER, differing={"0": ["rng:cpu"]})
    assert cause(Stage.SOURCE, (not_restored, FAILED)) is None
    assert cause(Stage.SOURCE, (HELD_AGAINST_WRITER, GateFacts("held"))) is None


# Another topology


@fires(TOPOLOGY_DATA)
@look_alike(TOPOLOGY_VALUES, wins=TOPOLOGY_DATA)
def test_samples_skipped_per_process_on_another_topology_are_the_data_whatever_the_values():
    """Resumed on 1 rank from a cursor counted per process: half the samples again, and a
    loss far from the uninterrupted run's: the data explains it."""
    shifted = topology_run(
        "resumed", 1, range(4, 7), loss=lambda s: 5.0, ids=lambda s: global_ids(s - 2)
    )
    d = cause(Stage.TOPOLOGY, judge(shifted))
    named(
        d,
        TOPOLOGY_DATA,
        "data order",
        "data not equivalent on 1 rank: over the global batch the resumed run consumed other "
        "samples (sample_ids, listed above) than the uninterrupted run on 2",
        "save the data position in global samples (steps x global batch), not per process",
    )
    assert "started from an earlier place in the data" in d.notes[0]


@fires(TOPOLOGY_VALUES)
@look_alike(TOPOLOGY_DATA, wins=TOPOLOGY_VALUES)
def test_every_sample_once_and_a_value_beyond_the_topologys_noise_is_an_unknown_cause():
    d = cause(
        Stage.TOPOLOGY,
        judge(topology_run("resumed", 1, range(4, 7), loss=lambda s: 1.0 / s + 1e-3)),
    )
    named(
        d,
        TOPOLOGY_VALUES,
        "unknown",
        "every sample was consumed exactly once at the same step, but 'loss' left the "
        "topology's noise at step 4",
    )


@look_alike(TOPOLOGY_VALUES, wins=None)
def test_a_resume_within_the_topologys_noise_has_no_cause():
    cmp, facts = judge(topology_run("resumed", 1, range(4, 7), loss=lambda s: 1.0 / s + 2e-6))
    assert cmp.equal and cause(Stage.TOPOLOGY, (cmp, facts)) is None


# A crash inside the save


@fires(CRASH)
def test_a_resume_from_what_a_crash_left_is_a_torn_checkpoint():
    d = cause(Stage.CRASH, CrashedAt("after torch.save of model.pt", "resumed from step 3"))
    named(
        d,
        CRASH,
        "torn checkpoint",
        "the resumed run loaded a checkpoint the crash at 'after torch.save of model.pt' "
        "(resumed from step 3) left torn or mixed",
        "write each checkpoint into a temporary folder and rename it once complete",
    )


# A resumed process, and the measured noise


def diverging(expected, actual, step=SPLIT + 1):
    """A comparison whose first divergence is the loss at `step` on rank 0."""
    div = Divergence(step, 0, "loss", "loss", expected, actual, "differs")
    return Comparison(SPLIT, STEPS, 1, divergence=div)


HELD = GateFacts("held", at="train.py:50")


@fires(FRESH)
@look_alike(NOISE, wins=FRESH)
def test_an_exact_resume_whose_first_step_differs_at_rounding_level_is_the_fresh_process():
    """What the noise stage would call beyond the measured noise, the resumed-process stage
    names first where it applies: the resume check asks it before anything else."""
    judged = Judged(HELD, diverging(1.0, 1.0000001), "resumed")
    named(
        cause(Stage.FRESH_PROCESS, judged),
        FRESH,
        "resumed-process compute",
        "the resumed process computes step 4 differently at rounding level (loss on rank 0): "
        "kernel selection or autotuning in a fresh process",
    )
    assert cause(Stage.NOISE, judged).rule == NOISE


@look_alike(FRESH, wins=None)
def test_beyond_rounding_after_the_first_step_or_with_a_failed_gate_is_no_fresh_process():
    for judged in (
        Judged(HELD, diverging(1.0, 1.1)),
        Judged(HELD, diverging(1.0, 1.0000001, step=SPLIT + 2)),
        Judged(FAILED, diverging(1.0, 1.0000001)),
        Judged(HELD, Comparison(SPLIT, STEPS, 1)),
    ):
        assert cause(Stage.FRESH_PROCESS, judged) is None, judged


def resumed_within(gaps, hashed=True):
    """(uninterrupted, resumed) runs of one rank: the resumed loss at step s is the
    uninterrupted run's times 1 + gaps[s] (steps 4-6); its watched weights' hash differs
    after the split while their statistics are equal (`hashed`)."""

    def values(scale, tag):
        def step(s):
            weights = {"w": {"hash": f"{tag}{s}", "norm": float(s)}}
            return {"loss": s / 2 * scale(s), "watch:model.params": weights}

        return step

    base = {0: run("uninterrupted", range(1, STEPS + 1), values(lambda s: 1.0, "h"))}
    other = "x" if hashed else "h"
    res = {0: run("resumed", range(SPLIT + 1, STEPS + 1), values(lambda s: 1 + gaps[s], other))}
    return base, res


def judged_runs(gate, gaps, hashed=True):
    base, res = resumed_within(gaps, hashed)
    return Judged(gate, compare_runs(base, res, SPLIT, STEPS), "resumed", runs=(base, res))


AT_ROUNDING = {4: 1e-7, 5: 1e-6, 6: 2e-4}
"""Relative gaps of the resumed losses, every one at rounding level (at most 1e-3)."""


@fires(THROUGHOUT)
def test_an_exact_resume_whose_every_later_value_stays_at_rounding_level_is_the_fresh_process():
    d = cause(Stage.FRESH_PROCESS, judged_runs(HELD, AT_ROUNDING))
    named(
        d,
        THROUGHOUT,
        "resumed-process compute",
        "the resumed process computes step 4 differently at rounding level (loss on rank 0), "
        "and every later step too: every value that differs stays at rounding level (at most "
        "relative 0.0002: loss, watch:model.params), another reduction order, kernel or code "
        "path in the resumed process, not a restore bug",
    )
    assert d.evidence["keys"] == ["loss", "watch:model.params"]
    assert d.evidence["gap"] > 1e-4


@look_alike(THROUGHOUT, wins=FRESH)
def test_a_later_step_that_differs_materially_leaves_only_the_first_steps_rounding():
    """Step 4 at rounding level, step 6 by 1%: what the resumed process missed moves the
    training; only the first step's difference is the fresh process's."""
    d = cause(Stage.FRESH_PROCESS, judged_runs(HELD, {**AT_ROUNDING, 6: 1e-2}))
    named(
        d,
        FRESH,
        "resumed-process compute",
        "the resumed process computes step 4 differently at rounding level (loss on rank 0): "
        "kernel selection or autotuning in a fresh process",
    )
    assert "every later step too" not in d.cause
    # no runs to read every step from: the first step alone
    assert cause(Stage.FRESH_PROCESS, Judged(HELD, diverging(1.0, 1.0000001))).rule == FRESH


@look_alike(THROUGHOUT, wins=None)
def test_rounding_level_throughout_after_a_failed_gate_or_a_material_first_step_is_no_cause():
    for judged in (
        judged_runs(FAILED, AT_ROUNDING),
        judged_runs(GateFacts("unknown"), AT_ROUNDING),
        judged_runs(HELD, {**AT_ROUNDING, 4: 0.5}),
    ):
        d = cause(Stage.FRESH_PROCESS, judged)
        assert d is None, (judged.gate, d and d.text())


@fires(NOISE)
def test_a_value_beyond_the_measured_noise_after_an_exact_resume_has_an_unknown_cause():
    d = cause(Stage.NOISE, Judged(HELD, diverging(1.0, 1.1), "resumed"))
    named(
        d,
        NOISE,
        "beyond the measured noise",
        f"the resume point matched exactly, but 'loss' at step 4, rank 0 left {NOISE_FACTOR:g}x "
        "the noise measured between resumed processes: cause unknown",
    )
    between_runs = cause(Stage.NOISE, Judged(HELD, None, "uninterrupted"))
    assert f"the steps recorded left {NOISE_FACTOR:g}x the noise measured between" in (
        between_runs.cause
    )
