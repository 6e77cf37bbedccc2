"""`@equivalent`: its marker's validation (only the marked item fails, naming the keyword),
and the comparison of two configurations over the global batch on hand-made signatures:
exact counters, learning rates and samples; the loss and the parameters within round-off,
sharded statistics combined, replicated ones taken once."""

import pytest

from pytest_resume_equiv.compare.configurations import FLOAT32_EPS, compare_configurations
from pytest_resume_equiv.configurations import parse_equivalent, variant_names
from pytest_resume_equiv.errors import SettingError
from pytest_resume_equiv.rank.encode import encode, encode_float
from pytest_resume_equiv.signature import Signature

VARIANTS = {"acc4": dict(args=["--accum", "4"]), "dp2": dict(nproc=2)}


def test_each_variant_is_an_item_compared_with_the_baseline():
    assert variant_names({"variants": VARIANTS}) == ["acc4", "dp2"]
    spec = parse_equivalent((), {"steps": 4, "variants": VARIANTS, "nproc": 1}, "acc4")
    conf = spec.configurations
    assert spec.splits == () and spec.steps == 4
    assert (conf.baseline.nproc, conf.baseline.args) == (1, ())
    assert (conf.name, conf.variant.nproc, conf.variant.args) == ("acc4", 1, ("--accum", "4"))
    dp2 = parse_equivalent((), {"steps": 4, "variants": VARIANTS, "nproc": 1}, "dp2")
    assert dp2.configurations.variant.nproc == 2


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"steps": 4, "variants": VARIANTS, "spilt": 2}, "unknown keyword 'spilt'"),
        ({"steps": 4}, "@equivalent needs variants=..."),
        ({"steps": 4, "variants": {}}, "invalid variants={}: expected a non-empty dict"),
        ({"steps": 0, "variants": VARIANTS}, "@equivalent: invalid steps=0"),
        ({"steps": 4, "variants": {"a": dict(nproc=0)}}, "invalid variants['a']="),
        ({"steps": 4, "variants": {"a": dict(args=[1])}}, "args must be a list of str"),
        ({"steps": 4, "variants": {"a": dict(ranks=2)}}, "unknown key 'ranks'"),
        ({"steps": 4, "variants": {"a": {}}}, "equals the baseline: nothing to compare"),
        ({"steps": 4, "variants": VARIANTS, "timeout": -1}, "@equivalent: invalid timeout=-1"),
        ({"steps": 4, "variants": VARIANTS, "tolerance": "cpu"}, "invalid tolerance='cpu'"),
        ({"steps": 4, "variants": VARIANTS, "auto": False}, "invalid auto=False"),
        ({"steps": 4, "variants": VARIANTS, "dropout": "no"}, 'expected "off"'),
        ({"steps": 4, "variants": VARIANTS, "ignore": [3]}, "@equivalent: invalid ignore=[3]"),
    ],
)
def test_a_bad_marker_names_the_keyword_and_the_value(kwargs, says):
    variant = next(iter(kwargs.get("variants") or {"a": 0}))
    with pytest.raises(SettingError) as raised:
        parse_equivalent((), kwargs, variant)
    assert says in str(raised.value)


def tensor(norm, absmax, tag="x"):
    return {"norm": encode_float(norm), "absmax": encode_float(absmax), "hash": tag}


def sig(rank, world, steps):
    """`steps`: step -> {key: value} of one rank."""
    recorded = [
        (s, {k: encode(v, k) if ":" not in k else v for k, v in values.items()})
        for s, values in steps.items()
    ]
    return Signature(
        f"r/rank-{rank}.jsonl",
        {"rank": rank, "world_size": world, "phase": "p"},
        recorded,
        complete=True,
    )


def step_values(loss, ids, lr=0.1, params=None, epoch=1):
    return {
        "auto:loss": [encode_float(x) for x in loss],
        "auto:data": ids,
        "watch:opt.lr": [encode_float(lr)],
        "watch:sched.last_epoch": epoch,
        "watch:model.params": params or {"w": tensor(2.0, 1.0)},
    }


BASE = {
    0: sig(
        0, 1, {1: step_values([0.5], [1, 2, 3, 4]), 2: step_values([0.4], [5, 6, 7, 8], epoch=2)}
    )
}


def test_two_ranks_with_accumulation_equal_the_baseline_over_the_global_batch():
    """Each rank's losses given to backward (scaled by 1/accumulation) summed over its
    micro-batches, averaged over ranks, is the global batch's mean; samples are counted
    over every rank and micro-batch."""
    ranks = {
        r: sig(
            r,
            2,
            {
                1: step_values([0.25, 0.25], [1 + 2 * r, 2 + 2 * r]),
                2: step_values([0.2, 0.2], [5 + 2 * r, 6 + 2 * r], epoch=2),
            },
        )
        for r in (0, 1)
    }
    found = compare_configurations(BASE, ranks, 2)
    assert found.equal, found.lines("v")
    assert found.steps == 2 and found.samples_key == "auto:data"


def test_a_loss_beyond_round_off_a_learning_rate_and_samples_are_each_named_at_their_step():
    variant = {
        0: sig(
            0,
            1,
            {
                1: step_values([1.0], [1, 2, 3, 4]),
                2: step_values([0.4], [5, 6, 7, 7], lr=0.2, epoch=2),
            },
        )
    }
    found = compare_configurations(BASE, variant, 2)
    whats = [(d.step, d.what) for d in found.differences]
    assert whats[0] == (1, "loss") and found.differences[0].relative == pytest.approx(0.5)
    assert (2, "watch:opt.lr") in whats
    assert any(s == 2 and w.startswith("samples consumed (auto:data") for s, w in whats)
    samples = next(d for d in found.differences if d.what.startswith("samples"))
    assert "1 repeated" in samples.variant and "1 not in the variant's" in samples.baseline


def test_round_off_is_bounded_by_the_global_batch_and_the_steps_taken():
    bound = FLOAT32_EPS * 4  # 4 samples, step 1
    within = {0: sig(0, 1, {1: step_values([0.5 * (1 + bound / 2)], [1, 2, 3, 4])})}
    beyond = {0: sig(0, 1, {1: step_values([0.5 * (1 + bound * 4)], [1, 2, 3, 4])})}
    assert compare_configurations(BASE, within, 1).equal
    found = compare_configurations(BASE, beyond, 1)
    assert [d.what for d in found.differences] == ["loss"]
    assert found.differences[0].bound == pytest.approx(bound)


def test_a_tolerance_replaces_the_round_off_bound_and_ignored_quantities_are_said():
    loose = {0: sig(0, 1, {1: step_values([0.5 * 1.001], [1, 2, 3, 4], lr=0.2)})}
    marker = parse_equivalent(
        (), {"steps": 1, "variants": VARIANTS, "tolerance": (1e-2, 0)}, "acc4"
    )
    assert marker.tolerance is not None
    found = compare_configurations(BASE, loose, 1, tolerance=marker.tolerance)
    assert [d.what for d in found.differences] == ["watch:opt.lr"]  # exact stays exact
    found = compare_configurations(BASE, loose, 1, ignore=["watch:opt.*", "loss"])
    assert found.equal and found.ignored == ["loss", "watch:opt.lr"]
    assert "  ignored (ignore=): loss, watch:opt.lr" in found.lines("v")
    assert parse_equivalent((), {"steps": 1, "variants": VARIANTS}, "acc4").tolerance is None


def test_sharded_statistics_are_combined_and_replicated_ones_taken_once():
    """FSDP: each rank's statistics are its shard's (norms combine as the root of the sum of
    squares, absmax as the largest); DDP: every rank holds the same, taken once."""
    shards = {
        r: sig(
            r,
            2,
            {
                1: step_values(
                    [0.25],
                    [1 + 2 * r, 2 + 2 * r],
                    params={"w": tensor(2.0**0.5, 1.0 - r / 2, f"s{r}")},
                )
            },
        )
        for r in (0, 1)
    }
    replicas = {
        r: sig(
            r,
            2,
            {1: step_values([0.25], [1 + 2 * r, 2 + 2 * r], params={"module.w": tensor(2.0, 1.0)})},
        )
        for r in (0, 1)
    }
    base = {0: sig(0, 1, {1: step_values([0.25], [1, 2, 3, 4])})}
    assert compare_configurations(base, shards, 1).equal
    assert compare_configurations(base, replicas, 1).equal  # DDP's "module." prefix too
    wrong = {
        r: sig(
            r,
            2,
            {
                1: step_values(
                    [0.25], [1 + 2 * r, 2 + 2 * r], params={"w": tensor(2.0, 1.0, f"s{r}")}
                )
            },
        )
        for r in (0, 1)
    }
    found = compare_configurations(base, wrong, 1)
    assert [d.what for d in found.differences] == ["model.params['w'].norm"]


def test_a_step_the_variant_never_recorded_is_named():
    found = compare_configurations(BASE, {0: sig(0, 1, {1: step_values([0.5], [1, 2, 3, 4])})}, 2)
    assert [(d.step, d.what) for d in found.differences] == [(2, "the step's records")]


def test_a_test_without_the_fixture_is_told_to_take_it():
    with pytest.raises(SettingError, match="take it \\(def test_x\\(resume_equiv\\)\\)"):
        parse_equivalent((), {"steps": 4, "variants": VARIANTS}, "?")


def test_runs_that_recorded_nothing_to_compare_are_no_equal_pair():
    empty = {0: sig(0, 1, {1: {"note": 1}})}
    found = compare_configurations(empty, empty, 1)
    assert [d.what for d in found.differences] == ["nothing recorded to compare"]


def test_a_tensor_only_round_off_moves_is_judged_on_the_scale_of_its_kind():
    """A bias whose true gradient is zero, moved by the optimizer from noise (1e-12 against
    parameters of about 1): a large relative difference that is nothing; a difference of that
    size in a parameter of ordinary size still counts."""
    params = {"w": tensor(1.0, 1.0), "b": tensor(1.0e-12, 1.0e-12)}
    noisy = {"w": tensor(1.0, 1.0), "b": tensor(1.3e-12, 1.3e-12)}
    base = {0: sig(0, 1, {1: step_values([0.5], [1, 2, 3, 4], params=params)})}
    variant = {0: sig(0, 1, {1: step_values([0.5], [1, 2, 3, 4], params=noisy)})}
    assert compare_configurations(base, variant, 1).equal
    moved = {"w": tensor(1.0 + 1e-5, 1.0), "b": tensor(1.0e-12, 1.0e-12)}
    variant = {0: sig(0, 1, {1: step_values([0.5], [1, 2, 3, 4], params=moved)})}
    assert [d.what for d in compare_configurations(base, variant, 1).differences] == [
        "model.params['w'].norm"
    ]


def test_a_trainer_that_stops_before_the_markers_steps_is_said_so():
    found = compare_configurations(BASE, BASE, 4)
    assert found.short and not found.equal
    assert found.differences[0].text() == (
        "step 3: optimizer steps run: baseline 2 of 4, variant 2 of 4"
    )
    assert any("the trainer must train exactly steps=" in line for line in found.lines("v"))
