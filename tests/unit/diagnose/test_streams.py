"""Stage.STREAM: one random stream that differs at the resume point, read with the restore
log and the draws traced before the first resumed step."""

import pytest

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose

from .builders import (
    LOAD,
    SEED,
    SET_CPU,
    SPLIT,
    diagnosed,
    diagnosis,
    fires,
    look_alike,
    named,
    point,
    restore,
    run,
    saved,
)

ID = "resume.stream."
FROM_OTHER_RANK, DERIVED = ID + "from-another-rank", ID + "derived-from-parent"
RESEEDED_REPLAYING = ID + "re-seeded-replaying-an-epoch"
BUILT_AFTER_LOAD, RESEEDED = ID + "generator-built-after-load", ID + "re-seeded"
REPEATED, ADVANCED = ID + "repeated-before-the-resume", ID + "restored-then-advanced"
TOO_LATE, WRONG = ID + "restored-too-late", ID + "restored-wrong"
NEVER_REPLAYING, NEVER = ID + "never-restored-replaying-an-epoch", ID + "never-restored"
EARLIER = ID + "restored-to-an-earlier-state"


@fires(NEVER)
def test_a_stream_seeded_before_the_load_and_not_restored_was_never_restored():
    d = diagnosis(point(), point(rng={"cpu": "x"}, restores=2), [SEED, LOAD])
    assert d.bug_class == "never restored"
    assert "the CPU RNG (torch's default generator) was never restored" in d.text()
    assert "Fix: save and restore it, torch.get_rng_state() / torch.set_rng_state()" in d.text()
    assert d.rule == NEVER


@fires(RESEEDED)
def test_a_stream_seeded_after_the_load_was_re_seeded():
    later = restore("torch.manual_seed", "rng:cpu", at="train.py:40")
    d = diagnosis(point(), point(rng={"cpu": "x"}, restores=2), [LOAD, later])
    assert d.bug_class == "re-seeded after loading" and "train.py:40" in d.text()
    named(
        d,
        RESEEDED,
        "re-seeded after loading",
        "was seeded again after the checkpoint was read (torch.manual_seed at train.py:40)",
        "seed before loading, or restore the stream after seeding",
    )


@fires(WRONG)
def test_a_stream_restored_with_no_draw_after_it_was_restored_wrong():
    d = diagnosis(point(), point(rng={"cpu": "x"}, restores=2), [LOAD, SET_CPU])
    named(
        d,
        WRONG,
        "restored wrong",
        "was restored (torch.set_rng_state at train.py:30) but differs",
        "save the stream's state after the step that ends at the split",
    )


# A generator seeded again after the checkpoint was read

GEN = "generator train.py:38 #0"
GEN_KEY = f"rng:{GEN}"
RESEED_GEN = restore("Generator.manual_seed", GEN_KEY, at="train.py:40")
ORDER = {1: [0, 5], 2: [3, 1], 3: [4, 2], 4: [5, 0], 5: [2, 3], 6: [1, 4]}
"""Sample ids of 6 samples, 3 steps an epoch."""


def with_gen(loss, ids, state):
    """A step's record: the loss, sample ids `ids(step)` and the generator's state."""
    return lambda s: {"loss": loss, "ids": ids(s), GEN_KEY: f"{state}{s}"}


def reseeded_generator(log, draws=(), replays=False):
    """The generator differs at the resume point; the resumed epoch replays the first epoch's
    ids when `replays`."""
    res_ids = (lambda s: ORDER[s - 3]) if replays else (lambda s: ORDER[s])
    return diagnosis(
        point(rng={GEN: "g"}),
        point(rng={GEN: "x"}, restores=len(log), draws=draws),
        log,
        with_gen(1.0, lambda s: ORDER[s], "g"),
        with_gen(2.0, res_ids, "x"),
    )


@fires(BUILT_AFTER_LOAD)
@look_alike(RESEEDED, wins=BUILT_AFTER_LOAD)
def test_a_generator_made_and_seeded_after_the_load_was_never_given_its_state():
    d = reseeded_generator([LOAD, RESEED_GEN])
    named(
        d,
        BUILT_AFTER_LOAD,
        "never restored",
        "was made and seeded after the checkpoint was read (Generator.manual_seed at "
        "train.py:40) and never given its saved state",
        "save and restore it, generator.get_state() / generator.set_state()",
    )


@look_alike(BUILT_AFTER_LOAD, wins=RESEEDED)
def test_a_generator_seeded_before_the_load_too_was_re_seeded():
    """Seeded when built, before the load, and again after it: the seeding after the load
    replaced the state the checkpoint restored."""
    before = restore("Generator.manual_seed", GEN_KEY, at="train.py:10")
    d = reseeded_generator([before, LOAD, RESEED_GEN])
    named(
        d,
        RESEEDED,
        "re-seeded after loading",
        "was seeded again after the checkpoint was read",
        "restore the stream after seeding (generator.get_state() / generator.set_state())",
    )


@fires(RESEEDED_REPLAYING)
@look_alike(RESEEDED_REPLAYING, wins=BUILT_AFTER_LOAD)
@pytest.mark.parametrize("op", ["randperm", "randint"])
def test_a_re_seeded_generator_replays_an_epoch_only_when_it_shuffles(op):
    d = reseeded_generator([LOAD, RESEED_GEN], [(op, GEN_KEY, "train.py:60", 2)], replays=True)
    if op == "randperm":
        named(
            d,
            RESEEDED_REPLAYING,
            "replayed epoch",
            "shuffles the data and was seeded again after the checkpoint was read",
            "set_state() it before the iterator starts",
        )
        assert d.cause.startswith("rank 0: the resumed epoch 1 consumes the samples of epoch 0")
    else:
        assert d.rule == BUILT_AFTER_LOAD and "shuffles the data" not in d.text()


# Draws after the restore, and before it


@fires(ADVANCED)
@look_alike(WRONG, wins=ADVANCED)
def test_restored_then_advanced_names_the_op_and_its_line_not_a_missing_restore():
    draws = [("random_", "rng:cpu", "train.py:33", 2), ("random_", "rng:cpu", "train.py:33", 2)]
    base = point(draws=[("randn", "rng:cpu", "train.py:60", 0)])
    res = point(
        rng={"cpu": "x"}, restores=2, draws=[*draws, ("randn", "rng:cpu", "train.py:60", 2)]
    )
    d = diagnosis(base, res, [LOAD, SET_CPU])
    assert d.bug_class == "restored then advanced"
    assert (
        "was restored (torch.set_rng_state at train.py:30) and then advanced by 2 draws" in d.text()
    )
    assert "random_ at train.py:33 (2 times)" in d.text() and "randn" not in d.text()
    named(
        d,
        ADVANCED,
        "restored then advanced",
        "advanced by 2 draws before the first resumed step",
        "restore the stream after that code runs",
    )


@fires(TOO_LATE)
def test_restored_too_late_when_the_resumed_run_drew_before_the_restore():
    base = point(draws=[("randn", "rng:cpu", "collate.py:9", 0)])
    res = point(rng={"cpu": "x"}, restores=2, draws=[("randn", "rng:cpu", "collate.py:9", 1)])
    d = diagnosis(base, res, [LOAD, SET_CPU])
    assert d.bug_class == "restored too late"
    assert "only after it had been drawn from (randn at collate.py:9)" in d.text()
    named(
        d,
        TOO_LATE,
        "restored too late",
        "was restored (torch.set_rng_state at train.py:30) only after it had been drawn from",
        "restore the stream before that code runs",
    )


@look_alike(TOO_LATE, wins=ADVANCED)
def test_draws_after_the_restore_are_named_before_a_draw_before_it():
    """Drawn from before the restore (a draw the uninterrupted run makes) and after it: the
    draws after the restore explain the state at the resume point."""
    base = point(draws=[("randn", "rng:cpu", "collate.py:9", 0)])
    draws = [("randn", "rng:cpu", "collate.py:9", 1), ("random_", "rng:cpu", "train.py:33", 2)]
    d = diagnosis(base, point(rng={"cpu": "x"}, restores=2, draws=draws), [LOAD, SET_CPU])
    assert d.rule == ADVANCED, d.text()
    assert "random_ at train.py:33" in d.cause and "collate.py:9" not in d.cause


# Another rank's state


def two_ranks(rank_1_restored, extra=None):
    """Two ranks whose CPU RNG was restored (set_rng_state); rank 1 resumed with
    `rank_1_restored` (the saved states are "r0" and "r1"); `extra`: streams rank 1 alone holds
    in the uninterrupted run."""

    def own(r):
        return (extra or {}) if r else {}

    def base_values(r):
        return lambda s: {"loss": 1.0, "rng:cpu": f"r{r}s{s}", **own(r)}

    def res_values(r):
        cpu = rank_1_restored if r else "r0"
        return lambda s: {"loss": 1.0 + 0.5 * r, "rng:cpu": f"{cpu}s{s}"}

    base = {
        r: run(
            "uninterrupted",
            range(1, 7),
            base_values(r),
            rank=r,
            points=[point(rng={"cpu": f"r{r}", **own(r)})],
        )
        for r in (0, 1)
    }
    res = {
        r: run(
            "resumed",
            range(4, 7),
            res_values(r),
            rank=r,
            points=[point(rng={"cpu": rank_1_restored if r else "r0"}, restores=2)],
            restores=[LOAD, SET_CPU],
        )
        for r in (0, 1)
    }
    return diagnosed(base, res)


@fires(FROM_OTHER_RANK)
def test_a_rank_holding_another_ranks_saved_state():
    d = two_ranks("r0")
    assert d.bug_class == "restored from another rank"
    assert d.text().startswith("rank 1: at the resume point rng:cpu equals rank 0's saved state")
    named(
        d,
        FROM_OTHER_RANK,
        "restored from another rank",
        "rank 1 was restored from rank 0's",
        "save each rank's own state, keyed by its global rank",
    )


@look_alike(FROM_OTHER_RANK, wins=WRONG)
def test_a_rank_restored_to_no_ranks_saved_state_was_restored_wrong():
    d = two_ranks("zz")
    assert d.rule == WRONG and d.cause.startswith("rank 1: the CPU RNG"), d.text()


@look_alike(FROM_OTHER_RANK, wins=NEVER)
def test_a_stream_neither_the_resumed_rank_nor_another_holds_is_no_other_ranks_state():
    """Rank 1 alone made a generator in the uninterrupted run, and its resumed run had not
    made it at the resume point: no state there to equal rank 0's, which saved none either."""
    d = two_ranks("r1", extra={GEN: "g"})
    named(
        d,
        NEVER,
        "never restored",
        "rank 1: the generator created at train.py:38 #0 was never restored",
        "generator.get_state() / generator.set_state()",
    )


def _never_restored_on(ranks, differ_on):
    """`ranks` ranks resumed with the CPU RNG never restored on the ranks `differ_on`."""
    base = {
        r: run(
            "uninterrupted",
            range(1, 7),
            lambda s, r=r: {"loss": 1.0 + s, "rng:cpu": f"r{r}s{s}"},
            rank=r,
            points=[point(rng={"cpu": f"r{r}"})],
        )
        for r in range(ranks)
    }
    res = {
        r: run(
            "resumed",
            range(4, 7),
            lambda s, r=r: {"loss": 2.0 + s, "rng:cpu": f"x{r}s{s}"},
            rank=r,
            points=[point(rng={"cpu": f"x{r}" if r in differ_on else f"r{r}"}, restores=2)],
            restores=[SEED, LOAD],
        )
        for r in range(ranks)
    }
    return diagnose(compare_runs(base, res, SPLIT, 6), base, res)


@fires(NEVER)
def test_a_cause_that_holds_on_several_ranks_names_them_all():
    """nanoGPT on 2 ranks: neither rank restores its CPU RNG; the cause is not rank 0's alone."""
    d = _never_restored_on(2, {0, 1})
    assert d.bug_class == "never restored"
    assert d.text().startswith("ranks 0-1: the CPU RNG (torch's default generator) was never")
    assert d.rule == NEVER and d.evidence["where"] == "ranks 0-1"
    assert _never_restored_on(4, {0, 1, 2, 3}).text().startswith("every rank: the CPU RNG")
    assert _never_restored_on(4, {0, 1, 3}).text().startswith("ranks 0-1, 3: the CPU RNG")
    assert _never_restored_on(2, {0}).text().startswith("rank 0: the CPU RNG")


# Code the resumed run repeats


EVAL_CKPT = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 50}
EVAL_BASE = point(checkpoint=EVAL_CKPT, draws=[("randint", "rng:cpu", "train.py:61", 0, 10)] * 4)
"""Rank 0 evaluates at the top of the iteration that saves (its batches from the CPU RNG): the
uninterrupted run draws them before writing the checkpoint (t=20)."""


def eval_repeated(log, files):
    """The resumed run draws the eval's batches again after its last restore."""
    after = len(log)
    draws = [("randint", "rng:cpu", "train.py:61", after, 900)] * 4
    res = point(rng={"cpu": "x"}, checkpoint=EVAL_CKPT, restores=after, draws=draws)
    return diagnosis(EVAL_BASE, res, log, files=files)


@fires(REPEATED)
@look_alike(ADVANCED, wins=REPEATED)
@look_alike(REPEATED, wins=WRONG)
def test_an_eval_the_resumed_run_repeats_before_its_first_step_is_named():
    """The same code ran once in each run: named as a repeat, not a bad restore."""
    d = eval_repeated([LOAD, SET_CPU], files=[saved("torch.save", 3, 20)])
    assert d.bug_class == "repeated before the resume"
    assert "repeats code the uninterrupted run ran before it wrote the checkpoint" in d.text()
    assert "randint at train.py:61 (4 times)" in d.text()
    named(
        d,
        REPEATED,
        "repeated before the resume",
        "the same draws the uninterrupted run made before its save",
        "do not run that code again at the resume iteration",
    )
    # without the save's events nothing tells the repeat: the draws are the same in both
    without = eval_repeated([LOAD, SET_CPU], files=[])
    assert without.bug_class != "repeated before the resume"
    assert without.rule == WRONG


@look_alike(REPEATED, wins=RESEEDED)
def test_a_repeat_after_a_seeding_is_the_seeding():
    seed = restore("torch.manual_seed", "rng:cpu", at="train.py:40")
    d = eval_repeated([LOAD, SET_CPU, seed], files=[saved("torch.save", 3, 20)])
    assert d.rule == RESEEDED and "torch.manual_seed at train.py:40" in d.cause, d.text()


# Restored to the state of an earlier point

AT_SPLIT_CPU = point(rng={"cpu": "c3"})
"""The uninterrupted run's snapshot at the split equals its record of step 3 (`c3`): like
with like."""
RESHUFFLED = [("randperm", "rng:cpu", "train.py:26", 2)]
"""The resumed epoch's shuffle drawn again after the restore (log entry 1)."""


def restored_to(cpu, base_point=AT_SPLIT_CPU, draws=RESHUFFLED):
    """The CPU RNG restored (set_rng_state at train.py:30), then drawn from by `draws`; at the
    resume point it holds `cpu`."""
    res = point(rng={"cpu": cpu}, restores=2, draws=draws)
    return diagnosis(base_point, res, [LOAD, SET_CPU])


@fires(EARLIER)
def test_a_stream_that_arrives_at_an_earlier_steps_state_was_restored_to_it():
    """After its restore and the shuffle drawn again, the CPU RNG holds what the
    uninterrupted run recorded at step 1 (its state at step 2's first forward)."""
    d = restored_to("c1")
    named(
        d,
        EARLIER,
        "restored to an earlier state",
        "the CPU RNG (torch's default generator) was restored (torch.set_rng_state at "
        "train.py:30) and, after the draws that follow (randperm at train.py:26), holds the "
        "uninterrupted run's state at the first forward of step 2 (after step 1), not the one "
        "at the save (after step 3)",
        "restore the CPU RNG (torch's default generator) to the state saved at the save "
        "(torch.get_rng_state() / torch.set_rng_state())",
    )
    assert d.evidence["after_step"] == 1 and d.evidence["split"] == SPLIT


@look_alike(EARLIER, wins=ADVANCED)
@pytest.mark.parametrize(
    ("cpu", "base_point"),
    [("x", AT_SPLIT_CPU), ("c1", point())],
    ids=["no-earlier-steps-state", "snapshot-unlike-its-split-record"],
)
def test_a_state_that_is_no_earlier_steps_record_like_with_like_was_advanced(cpu, base_point):
    """The state reached equals no earlier step's record; or the uninterrupted run's own
    snapshot (`c0`) is not its record of the split (`c3`), so the records are not taken where
    the snapshots are and say nothing of an earlier point: restored, then advanced."""
    d = restored_to(cpu, base_point)
    assert d.rule == ADVANCED, d.text()
    assert "advanced by 1 draw before the first resumed step" in d.cause


@look_alike(EARLIER, wins=WRONG)
def test_an_earlier_steps_state_with_no_draw_after_the_restore_was_restored_wrong():
    """No draw after the restore: the saved state itself is an earlier one."""
    d = restored_to("c1", draws=[("randperm", "rng:cpu", "train.py:26", 1)])
    assert d.rule == WRONG, d.text()


@look_alike(EARLIER, wins=REPEATED)
def test_draws_that_repeat_the_uninterrupted_runs_before_its_save_are_a_repeat_first():
    """The eval at the top of the iteration that saves, drawn again after the restore: the
    stream also arrives at an earlier step's recorded state, but the repeated draws explain
    it. Without the save's events nothing tells the repeat, and the earlier state is named."""
    base = point(
        rng={"cpu": "c3"},
        checkpoint=EVAL_CKPT,
        draws=[("randint", "rng:cpu", "train.py:61", 0, 10)] * 4,
    )
    draws = [("randint", "rng:cpu", "train.py:61", 2, 900)] * 4
    res = point(rng={"cpu": "c1"}, checkpoint=EVAL_CKPT, restores=2, draws=draws)
    d = diagnosis(base, res, [LOAD, SET_CPU], files=[saved("torch.save", 3, 20)])
    assert d.rule == REPEATED, d.text()
    assert diagnosis(base, res, [LOAD, SET_CPU]).rule == EARLIER


# One stream is one stream whatever its name (issue 30, item 1)

SAMPLER = "generator RandomSampler of the DataLoader built at train.py:12 #0"
"""A generator torch's RandomSampler makes whenever an iterator starts, seeded from the CPU
RNG: re-derived from the CPU stream."""


def judged(base_point, res_point, restores, base_values, res_values):
    from pytest_resume_equiv.checks.resume import judge_resume
    from pytest_resume_equiv.compare.comparators import Exact
    from pytest_resume_equiv.compare.tolerance import ComparisonRules

    base = {0: run("uninterrupted", range(1, 7), base_values, points=[base_point])}
    res = {0: run("resumed", range(4, 7), res_values, points=[res_point], restores=restores)}
    return judge_resume(base, res, SPLIT, Exact(ComparisonRules(6)), "resume", "split 3")


def with_generator(site, state):
    """A step's record: the loss, the CPU stream, and one generator made at `site`."""
    return lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", f"rng:generator {site} #0": f"{state}{s}"}


def test_a_generator_made_on_another_line_in_the_same_state_is_the_same_stream():
    """The resumed run makes its generator in its restore function (train.py:40) and gives it
    the saved state; the uninterrupted run made it at train.py:12: same states, no finding."""
    set_state = restore("Generator.set_state", "rng:generator train.py:40 #0", at="train.py:41")
    verdict = judged(
        point(rng={"generator train.py:12 #0": "g"}),
        point(
            rng={"generator train.py:40 #0": "g"},
            restores=2,
            draws=[("randn", "rng:generator train.py:40 #0", "train.py:60", 2)],
        ),
        [LOAD, set_state],
        with_generator("train.py:12", "g"),
        with_generator("train.py:40", "g"),
    )
    assert verdict.status == "passed", (verdict.comparison, verdict.facts)
    assert verdict.diagnosis is None


def test_a_generator_made_on_another_line_in_another_state_stays_a_finding():
    verdict = judged(
        point(rng={"generator train.py:12 #0": "g"}),
        point(rng={"generator train.py:40 #0": "x"}, restores=1),
        [LOAD],
        with_generator("train.py:12", "g"),
        with_generator("train.py:40", "x"),
    )
    assert verdict.status == "failed"
    assert verdict.diagnosis.rule == NEVER, verdict.diagnosis.text()


def sampler_case(res_point, restores):
    return diagnosis(
        point(rng={SAMPLER: "s"}),
        res_point,
        restores,
        base_values=lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", f"rng:{SAMPLER}": "s"},
        res_values=lambda s: {
            "loss": s / 3,
            "rng:cpu": f"{res_point['rng']['cpu'][0]}{s}",
            f"rng:{SAMPLER}": "x",
        },
    )


@fires(DERIVED)
def test_a_samplers_generator_that_differs_blames_the_cpu_rng_it_was_seeded_from():
    """The CPU RNG matches at the resume point (restored at the end of the restore function),
    the sampler's generator does not: the CPU RNG was wrong when the iterator started."""
    draws = [
        ("random_", "rng:cpu", "train.py:25", 1),
        ("randperm", f"rng:{SAMPLER}", "train.py:26", 1),
    ]
    d = sampler_case(point(rng={SAMPLER: "x"}, restores=2, draws=draws), [LOAD, SET_CPU])
    assert d.bug_class == "cpu RNG before the iterator started"
    assert (
        "the generator the RandomSampler of the DataLoader built at train.py:12 makes" in d.text()
    )
    assert "seeded from the CPU RNG (torch's default generator)" in d.text()
    assert "its iterator started at train.py:26" in d.text()
    assert "although it matches at the resume point" in d.text()
    assert d.text().count("Fix:") == 1 and "was never restored" not in d.text()
    named(
        d,
        DERIVED,
        "cpu RNG before the iterator started",
        "it is seeded from the CPU RNG (torch's default generator) when an iterator starts",
        "give the DataLoader a generator of its own (DataLoader(generator=g))",
    )


@look_alike(DERIVED, wins=NEVER)
def test_a_cpu_rng_never_restored_is_named_before_the_sampler_generator_it_seeds():
    d = sampler_case(point(rng={"cpu": "x", SAMPLER: "x"}, restores=1), [LOAD])
    assert d.bug_class == "never restored"
    assert "the CPU RNG (torch's default generator) was never restored" in d.text()
    assert d.rule == NEVER


# Only the fixes the evidence supports, most likely first (issue 30, item 6)


def advanced(draws, res_ids=None):
    """The CPU RNG restored at train.py:30, then drawn from by `draws` before the first step;
    the resumed steps consume `res_ids(step)` (the uninterrupted run [step])."""

    def base_values(s):
        return {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]}

    def res_values(s):
        return {"loss": s / 3, "rng:cpu": f"x{s}", "ids": res_ids(s) if res_ids else [s]}

    res = point(rng={"cpu": "x"}, restores=2, draws=draws)
    return diagnosis(point(), res, [LOAD, SET_CPU], base_values, res_values)


def seed_draws(*lines):
    """Draws of an iterator's seed (random_ of shape []) at `lines`, after the restore."""
    seed = {"op": "random_", "stream": "rng:cpu", "after_restores": 2, "shape": []}
    return [{**seed, "at": at} for at in lines]


@fires(ADVANCED)
def test_a_seed_drawn_after_the_restore_puts_the_loaders_own_generator_first():
    res = point(rng={"cpu": "x"}, restores=2)
    res["draws"] = seed_draws("train.py:33")
    d = diagnosis(
        point(),
        res,
        [LOAD, SET_CPU],
        lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]},
        lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", "ids": [s]},
    )
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("give the DataLoader started at train.py:33 a generator of its own")
    assert d.text().count("Fix:") == 1
    assert "prefetched" not in d.text()  # the ids show no batch lost
    assert d.rule == ADVANCED


def test_the_prefetch_theory_only_when_the_first_batch_differs():
    draws = [("randint", "rng:cpu", "train.py:33", 2)]
    lost = advanced(draws, res_ids=lambda s: [s + 10])
    fix = lost.text().split("Fix: ", 1)[1]
    assert fix.startswith("if that code fetches the first batch, the batch prefetched before")
    kept = advanced(draws)  # the first resumed step consumed the same samples
    assert "prefetch" not in kept.text() and kept.text().count("Fix:") == 1
    assert lost.rule == kept.rule == ADVANCED


def test_the_trainers_own_ids_decide_the_prefetch_theory_over_the_content():
    """Bug class 24 with automatic recording on: the same samples (the trainer's ids), their
    content augmented from the advanced stream (auto:data differs): no batch was lost."""
    draws = [("randn", "rng:cpu", "train.py:33", 2)]

    def values(rng, content):
        return lambda s: {"loss": s, "rng:cpu": f"{rng}{s}", "ids": [s], "auto:data": content(s)}

    res = point(rng={"cpu": "x"}, restores=2, draws=draws)
    base, augmented = values("c", lambda s: [10 * s]), values("x", lambda s: [10 * s + 1])
    d = diagnosis(point(), res, [LOAD, SET_CPU], base, augmented)
    assert d.bug_class == "restored then advanced"
    assert d.text().split("Fix: ", 1)[1].startswith("restore the stream after that code runs")
    assert "prefetch" not in d.text()
    assert d.rule == ADVANCED


@pytest.mark.parametrize("key", ["auto:data", "auto:batch"])
@pytest.mark.parametrize("first_batch, prefetch_first", [(999, False), (50, True)])
def test_content_fingerprints_blame_a_lost_prefetch_only_for_samples_seen_elsewhere(
    first_batch, prefetch_first, key
):
    """Recorded automatically, the samples are told by their content: a first batch found
    nowhere in the uninterrupted run may be the same samples augmented from the advanced
    stream, so the prefetch is no more than a last guess; the content of the uninterrupted
    run's step 5 at step 4 is other samples."""

    def base_values(s):
        return {"loss": s / 2, "rng:cpu": f"c{s}", key: [s * 10]}

    def res_values(s):
        data = [first_batch] if s == 4 else [s * 10 + 1]
        return {"loss": s / 3, "rng:cpu": f"x{s}", key: data}

    res = point(rng={"cpu": "x"}, restores=2, draws=[("randn", "rng:cpu", "train.py:33", 2)])
    d = diagnosis(point(), res, [LOAD, SET_CPU], base_values, res_values)
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("if that code fetches the first batch") is prefetch_first
    assert "prefetched" in fix  # a last guess at least
    assert d.rule == ADVANCED


def test_a_loader_iterators_seed_draws_put_its_generator_before_the_prefetch_theory():
    """HF no_trainer on one process: the resumed epoch's DataLoader iterator drew its seeds
    from the restored CPU RNG (random_ of shape []), and the first batch differs. Who drew is
    the iterator, so its own generator is the first fix; the prefetch idea comes after."""
    res = point(rng={"cpu": "x"}, restores=2)
    res["draws"] = seed_draws("data_loader.py:572", "data_loader.py:1327")
    d = diagnosis(
        point(),
        res,
        [LOAD, SET_CPU],
        lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]},
        lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", "ids": [s + 10]},
    )
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("give the DataLoader started at data_loader.py:572 a generator")
    assert fix.index("generator of its own") < fix.index("prefetched") < fix.index("after that")
    assert d.text().count("Fix:") == 1
    assert d.rule == ADVANCED


# A generator never restored, and a replayed epoch


@look_alike(NEVER_REPLAYING, wins=NEVER)
def test_a_batch_that_happens_to_repeat_is_no_replayed_epoch():
    """A generator never restored (it adds noise to the batch, it does not shuffle): the ids
    of the first resumed steps match; one later batch equals step 1's by chance."""
    order = {1: [0, 5], 2: [3, 1], 3: [7, 2], 4: [6, 4], 5: [1, 7], 6: [0, 2]}
    gen = "generator train.py:38 #0"

    def base_values(s):
        return {"loss": 1.0, "ids": order[s], f"rng:{gen}": f"g{s}"}

    def res_values(s):
        return {"loss": 2.0, "ids": order[1] if s == 6 else order[s], f"rng:{gen}": f"x{s}"}

    d = diagnosis(
        point(rng={gen: "g"}), point(rng={gen: "x"}, restores=1), [LOAD], base_values, res_values
    )
    assert d.bug_class == "never restored" and "consumes the samples" not in d.text()
    assert d.rule == NEVER


@fires(NEVER_REPLAYING, NEVER)
@look_alike(NEVER_REPLAYING, wins=NEVER)
@look_alike(NEVER, wins=NEVER_REPLAYING)
@pytest.mark.parametrize("op", ["randperm", "randint"])
def test_a_replayed_epoch_is_blamed_on_a_generator_only_when_it_shuffles(op):
    """A generator never restored makes the resumed ids (here drawn from it, like a diffusion
    trainer's timestep ids) repeat the first epoch's. Only a permutation drawn before the first
    forward shows that it shuffles the data; one that draws timesteps is never restored, not a
    replayed epoch."""
    order = {1: [0, 5], 2: [3, 1], 3: [4, 2], 4: [5, 0], 5: [2, 3], 6: [1, 4]}  # 3 steps an epoch
    gen = "generator toy/condition.py:28 #0"

    def base_values(s):
        return {"loss": 1.0, "ids": order[s], f"rng:{gen}": f"g{s}"}

    def res_values(s):
        return {"loss": 1.0, "ids": order[s - 3], f"rng:{gen}": f"x{s}"}

    draws = [(op, f"rng:{gen}", "train.py:60", 1)]
    d = diagnosis(
        point(rng={gen: "g"}),
        point(rng={gen: "x"}, restores=1, draws=draws),
        [LOAD],
        base_values,
        res_values,
    )
    if op == "randperm":
        assert d.bug_class == "replayed epoch" and "shuffles the data" in d.text()
        named(
            d,
            NEVER_REPLAYING,
            "replayed epoch",
            "shuffles the data and was never restored (no set_state call for it",
            "derive the shuffle from (seed, epoch)",
        )
    else:
        assert d.bug_class == "never restored" and "shuffles the data" not in d.text()
        named(
            d,
            NEVER,
            "never restored",
            "the generator created at toy/condition.py:28 #0 was never restored",
            "save and restore it, generator.get_state() / generator.set_state()",
        )
    assert d.text().count("Fix:") == 1


@fires(NEVER)
def test_a_latent_stream_never_leads_the_cause():
    """A VeOmni-shaped resume: the CPU RNG restored and then advanced by the base seed a
    StatefulDataLoader's iterator draws (nothing compared draws from it after), and the
    condition generator never restored. The generator is the cause; the CPU RNG is latent."""
    gen = "generator dit_train.py:96 #0"
    seed_draw = [("random_", "rng:cpu", "stateful_dataloader.py:431", 2)]
    base = point(rng={gen: "g3"})
    res = point(rng={"cpu": "x", gen: "g0"}, restores=2, draws=seed_draw)

    def values(cpu, noise):
        # the CPU RNG is the same at every step after the split: nothing draws from it
        return lambda s: {"loss": s / noise, "rng:cpu": cpu, f"rng:{gen}": f"{noise}-{s}"}

    d = diagnosis(base, res, [LOAD, SET_CPU], values("c", 2), values("x", 3))
    assert d.bug_class == "never restored", d.text()
    assert "the generator created at dit_train.py:96 #0 was never restored" in d.text()
    assert "CPU RNG" not in d.text()
    assert d.rule == NEVER


@look_alike(EARLIER, wins=WRONG)
def test_a_stream_the_resumed_run_does_not_hold_at_its_resume_point_matches_no_earlier_step():
    """Neither run recorded the generator at step 1: a missing value is no state, so it equals
    no earlier step's, and the stream is no earlier state."""
    d = diagnosis(
        point(rng={GEN: "g3"}),
        point(restores=2, draws=[("randn", GEN_KEY, "train.py:60", 2)]),
        [LOAD, restore("Generator.set_state", GEN_KEY)],
        base_values=lambda s: {
            "loss": s / 2,
            "rng:cpu": f"c{s}",
            **({GEN_KEY: f"g{s}"} if s > 1 else {}),
        },
        res_values=lambda s: {"loss": s / 3, "rng:cpu": f"c{s}", GEN_KEY: f"x{s}"},
    )
    assert d.rule != EARLIER, d.text()


# Drawn after the save by code the resumed run does not run

AFTER_SAVE = ID + "drawn-after-the-save"
EVAL_AFTER_SAVE = point(
    checkpoint=EVAL_CKPT, draws=[("random_", "rng:cpu", "data_loader.py:572", 0, 40)]
)
"""The uninterrupted run starts an evaluation loader at the epoch's end (its base seed from
the CPU RNG, t=40), after writing the checkpoint (t=20) and before its next step."""


@fires(AFTER_SAVE)
@look_alike(WRONG, wins=AFTER_SAVE)
def test_a_stream_drawn_after_the_save_by_code_the_resumed_run_skips_is_no_bad_restore():
    """The accelerate checkpointing example resumed at the end of its first epoch: the
    restore was right, the evaluation after the save moved the uninterrupted run's stream."""
    res = point(rng={"cpu": "x"}, checkpoint=EVAL_CKPT, restores=2)
    d = diagnosis(EVAL_AFTER_SAVE, res, [LOAD, SET_CPU], files=[saved("torch.save", 3, 20)])
    named(
        d,
        AFTER_SAVE,
        "drawn after the save",
        "drew from it after it wrote the checkpoint and before its next step (random_ at "
        "data_loader.py:572)",
        "give that code a generator of its own (an evaluation DataLoader",
    )
    # the same draws made before the save are no draws after it: the saved state holds them
    before = point(
        checkpoint=EVAL_CKPT, draws=[("random_", "rng:cpu", "data_loader.py:572", 0, 10)]
    )
    assert diagnosis(before, res, [LOAD, SET_CPU], files=[saved("torch.save", 3, 20)]).rule == WRONG


@look_alike(AFTER_SAVE, wins=ADVANCED)
def test_draws_of_the_resumed_runs_own_after_the_restore_are_an_advance_first():
    res = point(
        rng={"cpu": "x"},
        checkpoint=EVAL_CKPT,
        restores=2,
        draws=[("randperm", "rng:cpu", "train.py:70", 2, 900)],
    )
    d = diagnosis(EVAL_AFTER_SAVE, res, [LOAD, SET_CPU], files=[saved("torch.save", 3, 20)])
    assert d.rule == ADVANCED, d.text()


@look_alike(AFTER_SAVE, wins=TOO_LATE)
def test_the_draws_after_the_save_made_before_the_restore_are_a_restore_too_late():
    """The resumed run makes the uninterrupted run's after-save draw too, but before its
    restore (a batch fetched, then the RNG restored): too late, not skipped."""
    res = point(
        rng={"cpu": "x"},
        checkpoint=EVAL_CKPT,
        restores=2,
        draws=[("random_", "rng:cpu", "data_loader.py:572", 1, 900)],
    )
    d = diagnosis(EVAL_AFTER_SAVE, res, [LOAD, SET_CPU], files=[saved("torch.save", 3, 20)])
    assert d.rule == TOO_LATE, d.text()
