"""The diagnosis rules on hand-made signatures: resume-point snapshots, restore logs and draws
written by hand, one look-alike against another. No launches."""

import pytest

from pytest_resume_equiv.compare.diff import compare_runs
from pytest_resume_equiv.diagnose import diagnose
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.signature import Signature

SPLIT = 3


def point(rng=None, watch=None, draws=(), restores=0, checkpoint=None, time_ns=100, at=None):
    return {
        "split": SPLIT,
        "at": at or "train.py:50",
        "time_ns": time_ns,
        "rng": {"cpu": "c0", **(rng or {})},
        "watch": watch or {},
        "checkpoint": checkpoint,
        "draws": [
            {"op": op, "stream": stream, "at": at, "after_restores": after, "shape": None}
            | ({"time_ns": when[0]} if when else {})
            for op, stream, at, after, *when in draws
        ],
        "restores": restores,
    }


def restore(call, what, at="train.py:20"):
    return {"call": call, "what": what, "at": at, "after_step": None}


def run(phase, steps, values, rank=0, points=(), restores=(), files=()):
    """One rank's signature: `values(step)` -> the step's record (user keys and audit keys)."""
    header = {"rank": rank, "world_size": 1, "phase": phase}
    recorded = [
        (s, {k: encode(v, k) if ":" not in k else v for k, v in values(s).items()}) for s in steps
    ]
    return Signature(
        f"{phase}/rank-{rank}.jsonl",
        header,
        recorded,
        complete=True,
        restores=list(restores),
        resume_points=list(points),
        files=list(files),
    )


def diagnosis(
    base_point, res_point, restores, base_values=None, res_values=None, files=(), res_files=()
):
    """Diagnose a resume whose loss and CPU stream differ from step 4 on."""
    base_values = base_values or (lambda s: {"loss": s / 2, "rng:cpu": f"c{s}"})
    res_values = res_values or (lambda s: {"loss": s / 3, "rng:cpu": f"x{s}"})
    base = {0: run("uninterrupted", range(1, 7), base_values, points=[base_point], files=files)}
    res = {
        0: run(
            "resumed",
            range(4, 7),
            res_values,
            points=[res_point],
            restores=restores,
            files=res_files,
        )
    }
    cmp = compare_runs(base, res, SPLIT, 6)
    assert not cmp.equal
    return diagnose(cmp, base, res)


LOAD = restore("torch.load", "file /ckpt/step_3/rank-0.pt")
SEED = restore("torch.manual_seed", "rng:cpu", at="train.py:5")


def test_a_stream_seeded_before_the_load_and_not_restored_was_never_restored():
    d = diagnosis(point(), point(rng={"cpu": "x"}, restores=2), [SEED, LOAD])
    assert d.bug_class == "never restored"
    assert "the CPU RNG (torch's default generator) was never restored" in d.text()
    assert "Fix: save and restore it, torch.get_rng_state() / torch.set_rng_state()" in d.text()


def test_a_stream_seeded_after_the_load_was_re_seeded():
    later = restore("torch.manual_seed", "rng:cpu", at="train.py:40")
    d = diagnosis(point(), point(rng={"cpu": "x"}, restores=2), [LOAD, later])
    assert d.bug_class == "re-seeded after loading" and "train.py:40" in d.text()


def test_restored_then_advanced_names_the_op_and_its_line_not_a_missing_restore():
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    draws = [("random_", "rng:cpu", "train.py:33", 2), ("random_", "rng:cpu", "train.py:33", 2)]
    base = point(draws=[("randn", "rng:cpu", "train.py:60", 0)])
    res = point(
        rng={"cpu": "x"}, restores=2, draws=[*draws, ("randn", "rng:cpu", "train.py:60", 2)]
    )
    d = diagnosis(base, res, [LOAD, set_state])
    assert d.bug_class == "restored then advanced"
    assert (
        "was restored (torch.set_rng_state at train.py:30) and then advanced by 2 draws" in d.text()
    )
    assert "random_ at train.py:33 (2 times)" in d.text() and "randn" not in d.text()


def test_restored_too_late_when_the_resumed_run_drew_before_the_restore():
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    base = point(draws=[("randn", "rng:cpu", "collate.py:9", 0)])
    res = point(rng={"cpu": "x"}, restores=2, draws=[("randn", "rng:cpu", "collate.py:9", 1)])
    d = diagnosis(base, res, [LOAD, set_state])
    assert d.bug_class == "restored too late"
    assert "only after it had been drawn from (randn at collate.py:9)" in d.text()


def test_a_rank_holding_another_ranks_saved_state():
    base = {
        r: run(
            "uninterrupted",
            range(1, 7),
            lambda s, r=r: {"loss": 1.0, "rng:cpu": f"r{r}s{s}"},
            rank=r,
            points=[point(rng={"cpu": f"r{r}"})],
        )
        for r in (0, 1)
    }
    res = {
        r: run(
            "resumed",
            range(4, 7),
            lambda s: {"loss": 1.0, "rng:cpu": f"r0s{s}"},
            rank=r,
            points=[point(rng={"cpu": "r0"}, restores=2)],
            restores=[LOAD, restore("torch.set_rng_state", "rng:cpu")],
        )
        for r in (0, 1)
    }
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "restored from another rank"
    assert d.text().startswith("rank 1: at the resume point rng:cpu equals rank 0's saved state")


def test_train_eval_flags_come_before_any_rng_explanation():
    flags_base = {"model.modes": [], "model.params": {}}
    flags_res = {"model.modes": ["<root>", "drop"], "model.params": {}}
    d = diagnosis(
        point(watch=flags_base), point(rng={"cpu": "x"}, watch=flags_res, restores=1), [LOAD]
    )
    assert d.bug_class == "left in the wrong mode"
    assert "<root>, drop in eval mode in the resumed run only" in d.text()


def test_flags_of_snapshots_taken_at_different_places_are_no_wrong_mode():
    """The resumed snapshot at an eval's forward, the uninterrupted one at resume_point():
    eval mode there says nothing about the restore."""
    flags_base = {"model.modes": [], "model.params": {}}
    flags_res = {"model.modes": ["<root>", "drop"], "model.params": {}}
    at_eval = "first forward of GPT at train.py:31"
    d = diagnosis(point(watch=flags_base), point(watch=flags_res, restores=1, at=at_eval), [LOAD])
    assert d is None or d.bug_class != "left in the wrong mode"


def saved(op, after_step, time_ns, path="/ckpt/step_3/rank-0.pt", thread=None):
    event = {"op": op, "path": path, "after_step": after_step, "time_ns": time_ns}
    return {**event, "thread": thread} if thread else event


def test_a_rewritten_checkpoint_and_a_late_one_are_told_apart_by_the_saving_runs_events():
    """The uninterrupted run's resume point at t=100, the resumed run's at t=1000."""
    ckpt = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 50}
    base, res = point(checkpoint=ckpt), point(rng={"cpu": "x"}, checkpoint=ckpt, time_ns=1000)
    at_split = saved("torch.save", 3, 50)
    rewritten = diagnosis(base, res, [LOAD], files=[at_split, saved("torch.save", 5, 300)])
    assert rewritten.bug_class == "restored from another step"
    assert (
        "was written again by the uninterrupted run after it saved it at step 3" in rewritten.text()
    )
    assert "torch.save(rank-0.pt) after step 5" in rewritten.text()
    assert "put {split} in the checkpoint path" in rewritten.text()
    late = diagnosis(base, res, [LOAD], files=[saved("torch.save", 4, 300)])
    assert late.bug_class == "torn checkpoint" and "was not on disk when" in late.text()
    behind = diagnosis(base, res, [LOAD], files=[at_split, saved("open", 3, 150, thread="saver")])
    assert behind.bug_class == "torn checkpoint" and "in thread 'saver'" in behind.text()


def test_a_checkpoint_the_resumed_run_writes_back_into_or_rewritten_after_it_loaded_is_no_cause():
    ckpt = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 5000}
    base, res = point(checkpoint=ckpt), point(rng={"cpu": "x"}, checkpoint=ckpt, time_ns=1000)
    own = [saved("torch.save", 4, 1200)]  # the resumed run saves its state into that folder
    after = [saved("torch.save", 3, 50), saved("torch.save", 5, 2000)]  # after the load
    for d in (
        diagnosis(base, res, [LOAD], files=[saved("torch.save", 3, 50)], res_files=own),
        diagnosis(base, res, [LOAD], files=after),
    ):
        assert d.bug_class == "never restored"  # the checkpoint is not the cause


OPT = {"optimizer.lr": [0.1], "optimizer.hyper": [{}], "optimizer.params": {}}


@pytest.mark.parametrize(
    ("base_watch", "res_watch", "log", "bug_class", "words"),
    [
        (
            {**OPT, "optimizer.state": {"w": {"step": 3, "exp_avg": "a"}}},
            {**OPT, "optimizer.state": {"w": {}}},
            [LOAD],
            "optimizer never restored",
            "the optimizer 'optimizer' was never restored",
        ),
        (
            {**OPT, "optimizer.state": {"w": {"step": 3, "exp_avg": "a"}}},
            {**OPT, "optimizer.state": {"w": {}}},
            [LOAD, restore("Optimizer.load_state_dict", "watch:optimizer")],
            "optimizer state missing",
            "is missing or partial at the resume point (no entries for w)",
        ),
        (
            {"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3},
            {"scheduler.last_lr": [0.2], "scheduler.last_epoch": 4},
            [LOAD, restore("LRScheduler.load_state_dict", "watch:scheduler")],
            "LR scheduler off by one",
            "is one step ahead at the resume point",
        ),
        (
            {"scheduler.last_lr": [0.1], "scheduler.last_epoch": 3},
            {"scheduler.last_lr": [0.2], "scheduler.last_epoch": 0},
            [LOAD],
            "scheduler never restored",
            "warmup restarts",
        ),
        (
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
            [LOAD, restore("Module.load_state_dict", "watch:model")],
            "buffers",
            "buffer rm differs at the resume point",
        ),
        (
            {"model.params": {"w": {"hash": "a", "norm": encode(1.0, "n")}}, "model.modes": []},
            {"model.params": {"w": {"hash": "b", "norm": encode(1.001, "n")}}, "model.modes": []},
            [LOAD, restore("Module.load_state_dict", "watch:model")],
            "restored at reduced precision",
            "differ only at low-precision rounding level",
        ),
        (
            {"ema.state": {"n": 3}},
            {"ema.state": {"n": 0}},
            [LOAD],
            "watched state",
            "'ema' differs from the uninterrupted run's at the resume point (ema.state n)",
        ),
    ],
)
def test_objects_at_the_resume_point(base_watch, res_watch, log, bug_class, words):
    d = diagnosis(point(watch=base_watch), point(watch=res_watch, restores=len(log)), log)
    assert d.bug_class == bug_class, d.text()
    assert words in d.text()


def test_weights_that_equal_a_later_step_are_a_torn_checkpoint():
    def params(step):
        return {"w": {"hash": f"h{step}", "norm": encode(float(step), "n")}}

    def base_values(step):
        return {"loss": 1.0, "rng:cpu": "c", "watch:model.params": params(step)}

    base = point(watch={"model.params": params(3), "model.modes": []})
    res = point(watch={"model.params": params(4), "model.modes": []}, restores=2)
    log = [LOAD, restore("Module.load_state_dict", "watch:model")]
    d = diagnosis(
        base,
        res,
        log,
        base_values=base_values,
        res_values=lambda s: {"loss": 2.0, "rng:cpu": "c", "watch:model.params": params(s + 1)},
    )
    assert d.bug_class == "torn checkpoint"
    assert "holds 'model' (its parameters) as it was after step 4" in d.text()
    assert "a staging race" in d.text()


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


def test_without_a_resume_point_the_first_divergent_step_decides():
    base = {
        0: run("uninterrupted", range(1, 7), lambda s: {"loss": 1.0, "ids": [s], "rng:cpu": "c"})
    }
    res = {0: run("resumed", range(4, 7), lambda s: {"loss": 1.0, "ids": [s + 1], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order" and "sample ids differ (ids)" in d.text()


def test_a_data_order_difference_gets_a_lead_about_a_draw_before_a_restore():
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
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
            restores=[LOAD, set_state],
        )
    }
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert any(
        "was drawn from (random_ at loader.py:9) before it was restored" in n for n in d.notes
    )


@pytest.mark.parametrize("key", ["ids", "x"])
def test_a_batch_lost_at_the_resume_names_the_prefetch_and_the_skip_count(key):
    """The first resumed step consumed the uninterrupted run's next batch: one batch lost."""
    base = {0: run("uninterrupted", range(1, 7), lambda s: {key: [s], "rng:cpu": "c"})}
    res = {0: run("resumed", range(4, 7), lambda s: {key: [s + 1], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert "consumed the batch the uninterrupted run consumed at step 5" in d.text()
    assert "prefetched" in d.text() and "number of batches skipped" in d.text()


def test_another_order_is_no_lost_batch():
    base = {0: run("uninterrupted", range(1, 7), lambda s: {"ids": [s], "rng:cpu": "c"})}
    res = {0: run("resumed", range(4, 7), lambda s: {"ids": [s + 10], "rng:cpu": "c"})}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order" and "lost" not in d.text()


def test_an_eval_the_resumed_run_repeats_before_its_first_step_is_named():
    """Rank 0 evaluates at the top of the iteration that saves (its batches from the CPU RNG):
    the uninterrupted run draws them before writing the checkpoint, the resumed run again after
    restoring it. The same code ran once in each run: named as a repeat, not a bad restore."""
    ckpt = {"path": "/ckpt/step_3", "files": 1, "latest_ns": 50}
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    eval_draws = [("randint", "rng:cpu", "train.py:61", 0, 10)] * 4
    base = point(checkpoint=ckpt, draws=eval_draws)
    res = point(
        rng={"cpu": "x"},
        checkpoint=ckpt,
        restores=2,
        draws=[("randint", "rng:cpu", "train.py:61", 2, 900)] * 4,
    )
    save = saved("torch.save", 3, 20)
    d = diagnosis(base, res, [LOAD, set_state], files=[save])
    assert d.bug_class == "repeated before the resume"
    assert "repeats code the uninterrupted run ran before it wrote the checkpoint" in d.text()
    assert "randint at train.py:61 (4 times)" in d.text()
    # without the save's events nothing tells the repeat: the draws are the same in both
    assert diagnosis(base, res, [LOAD, set_state]).bug_class != "repeated before the resume"


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


def test_a_generator_made_on_another_line_in_another_state_stays_a_finding():
    verdict = judged(
        point(rng={"generator train.py:12 #0": "g"}),
        point(rng={"generator train.py:40 #0": "x"}, restores=1),
        [LOAD],
        with_generator("train.py:12", "g"),
        with_generator("train.py:40", "x"),
    )
    assert verdict.status == "failed"


def test_a_samplers_generator_that_differs_blames_the_cpu_rng_it_was_seeded_from():
    """The CPU RNG matches at the resume point (restored at the end of the restore function),
    the sampler's generator does not: the CPU RNG was wrong when the iterator started."""
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    draws = [
        ("random_", "rng:cpu", "train.py:25", 1),
        ("randperm", f"rng:{SAMPLER}", "train.py:26", 1),
    ]
    d = diagnosis(
        point(rng={SAMPLER: "s"}),
        point(rng={SAMPLER: "x"}, restores=2, draws=draws),
        [LOAD, set_state],
        base_values=lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", f"rng:{SAMPLER}": "s"},
        res_values=lambda s: {"loss": s / 3, "rng:cpu": f"c{s}", f"rng:{SAMPLER}": "x"},
    )
    assert d.bug_class == "cpu RNG before the iterator started"
    assert (
        "the generator the RandomSampler of the DataLoader built at train.py:12 makes" in d.text()
    )
    assert "seeded from the CPU RNG (torch's default generator)" in d.text()
    assert "its iterator started at train.py:26" in d.text()
    assert "although it matches at the resume point" in d.text()
    assert d.text().count("Fix:") == 1 and "was never restored" not in d.text()


def test_a_cpu_rng_never_restored_is_named_before_the_sampler_generator_it_seeds():
    d = diagnosis(
        point(rng={SAMPLER: "s"}),
        point(rng={"cpu": "x", SAMPLER: "x"}, restores=1),
        [LOAD],
        base_values=lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", f"rng:{SAMPLER}": "s"},
        res_values=lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", f"rng:{SAMPLER}": "x"},
    )
    assert d.bug_class == "never restored"
    assert "the CPU RNG (torch's default generator) was never restored" in d.text()


# Another step's checkpoint loaded (issue 30, item 2)


def newest_folder_case(read, files, base_params_at_point=3):
    """The uninterrupted run saves step 3 and step 6 (`files`); the resumed run was pointed at
    step 3's folder and its restore log reads `read`; what it restored is step 6's state."""

    def params(step):
        return {"w": {"hash": f"h{step}", "norm": encode(float(step), "n")}}

    def base_values(step):
        return {"loss": float(step), "rng:cpu": f"c{step}", "watch:model.params": params(step)}

    base = point(rng={"cpu": "c3"}, watch={"model.params": params(base_params_at_point)})
    res = point(
        rng={"cpu": "c6"},
        watch={"model.params": params(6)},
        restores=3,
        checkpoint={"path": "/ckpt/step_3"},
    )
    log = [
        restore("torch.load", f"file {read}", at="train.py:90"),
        restore("Module.load_state_dict", "watch:model"),
        restore("torch.set_rng_state", "rng:cpu", at="train.py:95"),
    ]
    return diagnosis(
        base,
        res,
        log,
        base_values=base_values,
        res_values=lambda s: {
            "loss": s + 3.0,
            "rng:cpu": f"c{s + 3}",
            "watch:model.params": params(s + 3),
        },
        files=files,
    )


SAVES = [
    saved("torch.save", 3, 50, "/ckpt/step_3/state.pt"),
    saved("torch.save", 6, 200, "/ckpt/step_6/state.pt"),
]


def test_a_checkpoint_of_a_later_step_is_named_before_the_rng_rules():
    d = newest_folder_case("/ckpt/step_6/state.pt", SAVES)
    assert d.bug_class == "another step's checkpoint loaded", d.text()
    assert d.text().startswith("rank 0: loaded the checkpoint of step 6, not the one of step 3")
    assert "read /ckpt/step_6/state.pt (torch.load at train.py:90)" in d.text()
    assert "equals the uninterrupted run's state after step 6" in d.text()
    assert d.text().count("Fix:") == 1
    assert "Fix: load the checkpoint the resume was pointed at (/ckpt/step_3)" in d.text()
    assert "CPU RNG" not in d.text()


def test_reading_the_given_checkpoint_is_no_other_step():
    d = newest_folder_case("/ckpt/step_3/state.pt", SAVES)
    assert d.bug_class != "another step's checkpoint loaded"


# Never contradict the resume point (issue 30, item 3)


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


# Only the fixes the evidence supports, most likely first (issue 30, item 6)


def advanced(draws, res_ids=None):
    """The CPU RNG restored at train.py:30, then drawn from by `draws` before the first step;
    the resumed steps consume `res_ids(step)` (the uninterrupted run [step])."""
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")

    def base_values(s):
        return {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]}

    def res_values(s):
        return {"loss": s / 3, "rng:cpu": f"x{s}", "ids": res_ids(s) if res_ids else [s]}

    res = point(rng={"cpu": "x"}, restores=2, draws=draws)
    return diagnosis(point(), res, [LOAD, set_state], base_values, res_values)


def test_a_seed_drawn_after_the_restore_puts_the_loaders_own_generator_first():
    res = point(rng={"cpu": "x"}, restores=2)
    res["draws"] = [
        {
            "op": "random_",
            "stream": "rng:cpu",
            "at": "train.py:33",
            "after_restores": 2,
            "shape": [],
        }
    ]
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    d = diagnosis(
        point(),
        res,
        [LOAD, set_state],
        lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]},
        lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", "ids": [s]},
    )
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("give the DataLoader started at train.py:33 a generator of its own")
    assert d.text().count("Fix:") == 1
    assert "prefetched" not in d.text()  # the ids show no batch lost


def test_the_prefetch_theory_only_when_the_first_batch_differs():
    draws = [("randint", "rng:cpu", "train.py:33", 2)]
    lost = advanced(draws, res_ids=lambda s: [s + 10])
    fix = lost.text().split("Fix: ", 1)[1]
    assert fix.startswith("if that code fetches the first batch, the batch prefetched before")
    kept = advanced(draws)  # the first resumed step consumed the same samples
    assert "prefetch" not in kept.text() and kept.text().count("Fix:") == 1


def test_the_trainers_own_ids_decide_the_prefetch_theory_over_the_content():
    """Bug class 24 with automatic recording on: the same samples (the trainer's ids), their
    content augmented from the advanced stream (auto:data differs): no batch was lost."""
    draws = [("randn", "rng:cpu", "train.py:33", 2)]
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")

    def values(rng, content):
        return lambda s: {"loss": s, "rng:cpu": f"{rng}{s}", "ids": [s], "auto:data": content(s)}

    res = point(rng={"cpu": "x"}, restores=2, draws=draws)
    base, augmented = values("c", lambda s: [10 * s]), values("x", lambda s: [10 * s + 1])
    d = diagnosis(point(), res, [LOAD, set_state], base, augmented)
    assert d.bug_class == "restored then advanced"
    assert d.text().split("Fix: ", 1)[1].startswith("restore the stream after that code runs")
    assert "prefetch" not in d.text()


def without_points(base_values, res_values):
    base = {0: run("uninterrupted", range(1, 7), base_values)}
    res = {0: run("resumed", range(4, 7), res_values)}
    return diagnose(compare_runs(base, res, SPLIT, 6), base, res)


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


def test_a_data_order_cause_names_the_replayed_epoch_from_the_ids():
    """8 samples, 2 per step: steps 1-4 are epoch 0; the resumed epoch 1 consumes epoch 0's
    order again."""
    order = {1: [0, 5], 2: [3, 1], 3: [7, 2], 4: [6, 4], 5: [1, 7], 6: [0, 2]}

    def base_values(s):
        return {"loss": 1.0, "ids": order[s]}

    def res_values(s):
        return {"loss": 1.0, "ids": order[s - 4 if s > 4 else s]}

    d = without_points(base_values, res_values)
    assert d.bug_class == "data order"
    assert "the resumed epoch 1 consumes the samples of epoch 0's steps 1-2, in order" in d.text()
    # every audited stream matches: the sampler's epoch first, then a generator's state
    assert "Fix: restore the sampler's epoch before iterating (set_epoch(saved_epoch))" in d.text()
    assert "otherwise save the shuffling generator's state from before" in d.text()
    assert d.text().count("Fix:") == 1


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
    else:
        assert d.bug_class == "never restored" and "shuffles the data" not in d.text()
    assert d.text().count("Fix:") == 1


@pytest.mark.parametrize("with_points", [True, False])
def test_an_optimizer_step_of_fewer_micro_batches_is_the_accumulation_counter(with_points):
    """Recorded automatically (a value per backward()): the resumed run's step 4 took one
    micro-batch where the uninterrupted run's took two, and every stream and watched object
    matched at the resume point: the micro-step counter was restored out of phase."""

    def values(losses):
        return lambda s: {"auto:loss": losses(s), "auto:data": [s * 10 + i for i in range(4)]}

    base_values = values(lambda s: [s / 2, s / 3])
    res_values = values(lambda s: [s / 2] if s == 4 else [s / 5, s / 7])
    if with_points:
        d = diagnosis(point(), point(), [LOAD], base_values, res_values)
    else:
        d = without_points(base_values, res_values)
    assert d.bug_class == "gradient accumulation"
    assert "took 1 micro-batch (backward calls) in the resumed run and 2" in d.text()
    assert "gradient-accumulation micro-step counter" in d.text()


@pytest.mark.parametrize("key", ["auto:data", "auto:batch"])
@pytest.mark.parametrize("first_batch, prefetch_first", [(999, False), (50, True)])
def test_content_fingerprints_blame_a_lost_prefetch_only_for_samples_seen_elsewhere(
    first_batch, prefetch_first, key
):
    """Recorded automatically, the samples are told by their content: a first batch found
    nowhere in the uninterrupted run may be the same samples augmented from the advanced
    stream, so the prefetch is no more than a last guess; the content of the uninterrupted
    run's step 5 at step 4 is other samples."""
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")

    def base_values(s):
        return {"loss": s / 2, "rng:cpu": f"c{s}", key: [s * 10]}

    def res_values(s):
        data = [first_batch] if s == 4 else [s * 10 + 1]
        return {"loss": s / 3, "rng:cpu": f"x{s}", key: data}

    res = point(rng={"cpu": "x"}, restores=2, draws=[("randn", "rng:cpu", "train.py:33", 2)])
    d = diagnosis(point(), res, [LOAD, set_state], base_values, res_values)
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("if that code fetches the first batch") is prefetch_first
    assert "prefetched" in fix  # a last guess at least


# The model's inputs by content (auto:data), with no sample ids recorded (issue 31)


def inputs(step):
    return [1000 * step + k for k in range(4)]


def auto_runs(res_inputs, res_steps=range(4, 7), res_rng=None, res_point=None, loaded=None):
    """An exact resume point (the gate held), the resumed run given `res_inputs(step)`;
    `loaded`: (the uninterrupted run's, the resumed run's) batches a DataLoader yielded."""

    def values(batch, rng, yielded=None):
        return lambda s: {
            "auto:loss": [s / 2],
            "auto:data": batch(s),
            "rng:cpu": rng(s),
            **({"auto:batch": yielded(s)} if yielded else {}),
        }

    base_loaded, res_loaded = loaded or (None, None)
    base = {
        0: run(
            "uninterrupted",
            range(1, 7),
            values(inputs, lambda s: f"c{s}", base_loaded),
            points=[point()],
        )
    }
    res = {
        0: run(
            "resumed",
            res_steps,
            values(res_inputs, res_rng or (lambda s: f"c{s}"), res_loaded),
            points=[res_point or point(restores=1)],
            restores=[LOAD],
        )
    }
    return base, res


def test_inputs_that_differ_at_the_first_step_are_never_computed_differently():
    """The gate-held rule: every audited value matched at the resume point, but the first
    resumed step was given other inputs. The inputs differ: a data-order cause from them."""
    base, res = auto_runs(lambda s: inputs(s - 1))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "step 4 consumed the batch of step 3 again" in d.text() and d.text().count("Fix:") == 1


def test_a_batch_lost_at_the_resume_is_named_from_the_inputs():
    base, res = auto_runs(lambda s: inputs(s + 1))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order"
    assert "the batch of step 4 was never consumed" in d.text()
    assert "one batch was lost at the resume" in d.text()


def test_new_inputs_with_nothing_to_tell_samples_from_transforms_are_an_unknown_cause():
    """Inputs found nowhere in the uninterrupted run, every audited stream matching, no loader
    seen: other samples (another order, ones the uninterrupted run did not reach) and the same
    samples transformed make them alike. Neither is named; the Fix says how to tell."""
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s)])
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unknown", d.text()
    assert "other samples (another order, or ones the uninterrupted run did not reach" in d.text()
    assert "or the same samples transformed otherwise" in d.text()
    assert "the cause is unknown" in d.text() and d.text().count("Fix:") == 1
    assert "record each batch's sample ids" in d.text().split("Fix:")[1]
    for wrong in ("never seen", "seen twice", "never consumed", "data order was not restored"):
        assert wrong not in d.text()


def test_loaded_batches_that_match_name_the_change_after_loading():
    """Noise added in the loop from a source the audit does not see: the batches the
    DataLoader yielded are the uninterrupted run's, the model's inputs are not. The samples
    were changed after loading: that, not their order, and not "unknown"."""
    batches = (inputs, inputs)
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s)], loaded=batches)
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unaudited input", d.text()
    assert "the batches the DataLoader yielded are the uninterrupted run's" in d.text()
    assert "changed after loading" in d.text() and d.text().count("Fix:") == 1


def test_a_batch_skipped_under_noise_is_named_from_the_loaded_batches():
    """A diffusion trainer: noise added to every batch in the loop, so every input of the
    resumed run is new whatever its order. The batches the DataLoader yielded show the skip."""
    batches = (inputs, lambda s: inputs(s + 1))
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s + 1)], loaded=batches)
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "the batches the DataLoader yielded (auto:batch" in d.text()
    assert "the batch of step 4 was never consumed" in d.text()
    assert "one batch was lost at the resume" in d.text() and d.text().count("Fix:") == 1


def test_batches_replayed_lead_over_a_stream_restored_then_advanced():
    """HF Trainer with --ignore_data_skip: the RNG restored, then advanced by the resumed
    epoch's iterator seed; the resumed epoch starts over, so steps 4-6 consume steps 1-3's
    batches. A stream restored from the saved state replays no earlier data: the replay
    leads, the advance is noted."""
    set_state = restore("torch.set_rng_state", "rng:cpu", at="trainer.py:30")
    advanced = point(
        rng={"cpu": "x"}, restores=2, draws=[("random_", "rng:cpu", "data_loader.py:572", 2)]
    )
    batches = (inputs, lambda s: inputs(s - 3))
    base, res = auto_runs(
        lambda s: inputs(s - 3), res_point=advanced, res_rng=lambda s: f"x{s}", loaded=batches
    )
    res[0].restores[:] = [LOAD, set_state]
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "data order", d.text()
    assert "consumed at steps 4-6 the samples of steps 1-3, in order" in d.text()
    assert "started the data over from an earlier place" in d.text()
    assert d.text().count("Fix:") == 1
    assert any("restored (torch.set_rng_state" in n and "advanced by" in n for n in d.notes)
    # a stream never restored does replay the data it drew: it stays the cause
    base, res = auto_runs(
        lambda s: inputs(s - 3),
        res_point=point(rng={"cpu": "x"}, restores=1),
        res_rng=lambda s: f"x{s}",
        loaded=batches,
    )
    assert diagnose(compare_runs(base, res, SPLIT, 6), base, res).bug_class == "never restored"


def test_new_inputs_from_a_stream_not_restored_blame_the_stream_and_note_the_effect():
    base, res = auto_runs(
        lambda s: [i + 7 for i in inputs(s)],
        res_rng=lambda s: f"x{s}",
        res_point=point(rng={"cpu": "x"}, restores=1),
    )
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "never restored", d.text()
    assert any("found nowhere in the uninterrupted run from step 4 on" in n for n in d.notes)


def test_a_resume_that_re_executes_the_epoch_it_was_saved_in_is_named():
    """The resumed run ran 6 steps, not 3: numbered 4-9, its inputs those of steps 1-6."""
    base, res = auto_runs(lambda s: inputs(s - 3), res_steps=range(4, 10))
    cmp = compare_runs(base, res, SPLIT, 6)
    assert cmp.divergence is None and cmp.problems
    d = diagnose(cmp, base, res)
    assert d.bug_class == "re-executed steps"
    assert "re-executed steps 1-3" in d.text() and d.text().count("Fix:") == 1


def test_steps_past_the_end_without_a_replay_in_the_data_get_no_cause():
    base, res = auto_runs(inputs, res_steps=range(4, 10))
    assert diagnose(compare_runs(base, res, SPLIT, 6), base, res) is None


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


def test_inputs_that_differ_beside_recorded_ids_that_match_are_the_worker_seeds():
    """The trainer records its sample ids (an explicit call: what automatic recording cannot
    tell apart from content), the model's inputs by content differ: the same samples made
    otherwise, by loader workers seeded anew."""

    def values(shift):
        return lambda s: {"loss": s / (2 + shift), "ids": [s], "auto:data": [s * 10 + shift]}

    base = {0: run("uninterrupted", range(1, 7), values(0), points=[point()])}
    res = {0: run("resumed", range(4, 7), values(1), points=[point(restores=1)], restores=[LOAD])}
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "dataloader workers", d.text()
    assert "sample content differs (auto:data) while the sample ids (ids)" in d.text()


def test_inputs_of_a_later_step_after_matching_ones_are_a_skip_made_again():
    """The resumed run matched at step 4, then consumed step 6's inputs at step 5 (by content,
    no ids): the resume's skip applied a second time (a persistent worker's)."""
    base, res = auto_runs(lambda s: inputs(s + 1) if s == 5 else inputs(s))
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "skipped again", d.text()
    assert "the resumed run matched through step 4, then consumed the samples of step 6" in d.text()


def test_new_inputs_after_a_draw_before_the_restore_get_the_workers_lead():
    """Augmentation in DataLoader workers: their seeds come from a base seed the iterator drew
    from the CPU RNG before the trainer restored it. The CPU RNG matches at the resume point,
    the inputs are new: the draw before the restore is the lead."""
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    drew = point(restores=2, draws=[("random_", "rng:cpu", "dataloader.py:9", 1)])
    base, res = auto_runs(lambda s: [i + 7 for i in inputs(s)], res_point=drew)
    res[0].restores[:] = [LOAD, set_state]
    d = diagnose(compare_runs(base, res, SPLIT, 6), base, res)
    assert d.bug_class == "unknown", d.text()
    assert any(
        "drawn from (random_ at dataloader.py:9) before it was restored" in n for n in d.notes
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


def test_a_cause_that_holds_on_several_ranks_names_them_all():
    """nanoGPT on 2 ranks: neither rank restores its CPU RNG; the cause is not rank 0's alone."""
    d = _never_restored_on(2, {0, 1})
    assert d.bug_class == "never restored"
    assert d.text().startswith("ranks 0-1: the CPU RNG (torch's default generator) was never")
    assert _never_restored_on(4, {0, 1, 2, 3}).text().startswith("every rank: the CPU RNG")
    assert _never_restored_on(4, {0, 1, 3}).text().startswith("ranks 0-1, 3: the CPU RNG")
    assert _never_restored_on(2, {0}).text().startswith("rank 0: the CPU RNG")


def test_a_loader_iterators_seed_draws_put_its_generator_before_the_prefetch_theory():
    """HF no_trainer on one process: the resumed epoch's DataLoader iterator drew its seeds
    from the restored CPU RNG (random_ of shape []), and the first batch differs. Who drew is
    the iterator, so its own generator is the first fix; the prefetch idea comes after."""
    seed = {"op": "random_", "stream": "rng:cpu", "after_restores": 2, "shape": []}
    res = point(rng={"cpu": "x"}, restores=2)
    res["draws"] = [{**seed, "at": "data_loader.py:572"}, {**seed, "at": "data_loader.py:1327"}]
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    d = diagnosis(
        point(),
        res,
        [LOAD, set_state],
        lambda s: {"loss": s / 2, "rng:cpu": f"c{s}", "ids": [s]},
        lambda s: {"loss": s / 3, "rng:cpu": f"x{s}", "ids": [s + 10]},
    )
    assert d.bug_class == "restored then advanced"
    fix = d.text().split("Fix: ", 1)[1]
    assert fix.startswith("give the DataLoader started at data_loader.py:572 a generator")
    assert fix.index("generator of its own") < fix.index("prefetched") < fix.index("after that")
    assert d.text().count("Fix:") == 1


DCP_LOAD = restore("torch.distributed.checkpoint.load", "file /ckpt/step_3")


def test_a_scheduler_is_never_restored_by_a_load_that_writes_tensors_in_place():
    """DCP restores weights and optimizer moments in place, unlogged; a scheduler's counters
    it cannot: with no load_state_dict call for it, it was never restored (issue 40)."""
    base = point(watch={"lr_scheduler.last_lr": [0.1], "lr_scheduler.last_epoch": 3})
    res = point(watch={"lr_scheduler.last_lr": [0.2], "lr_scheduler.last_epoch": 0}, restores=1)
    d = diagnosis(base, res, [DCP_LOAD])
    assert d.bug_class == "scheduler never restored", d.text()
    assert "the LR scheduler 'lr_scheduler' was never restored" in d.text()
    assert d.text().count("Fix:") == 1


def test_a_latent_stream_never_leads_the_cause():
    """A VeOmni-shaped resume: the CPU RNG restored and then advanced by the base seed a
    StatefulDataLoader's iterator draws (nothing compared draws from it after), and the
    condition generator never restored. The generator is the cause; the CPU RNG is latent."""
    gen = "generator dit_train.py:96 #0"
    set_state = restore("torch.set_rng_state", "rng:cpu", at="train.py:30")
    seed_draw = [("random_", "rng:cpu", "stateful_dataloader.py:431", 2)]
    base = point(rng={gen: "g3"})
    res = point(rng={"cpu": "x", gen: "g0"}, restores=2, draws=seed_draw)

    def values(cpu, noise):
        # the CPU RNG is the same at every step after the split: nothing draws from it
        return lambda s: {"loss": s / noise, "rng:cpu": cpu, f"rng:{gen}": f"{noise}-{s}"}

    d = diagnosis(base, res, [LOAD, set_state], values("c", 2), values("x", 3))
    assert d.bug_class == "never restored", d.text()
    assert "the generator created at dit_train.py:96 #0 was never restored" in d.text()
    assert "CPU RNG" not in d.text()


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
