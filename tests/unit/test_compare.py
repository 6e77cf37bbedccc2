"""The pure comparison and its report text, on hand-made signatures."""

import pytest
import torch

from pytest_resume_equiv.compare.diff import compare_runs, format_comparison
from pytest_resume_equiv.compare.step_problems import step_ranges
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.signature import Signature, readable


def sig(rank, phase, steps, world_size=2):
    header = {"rank": rank, "world_size": world_size, "phase": phase}
    encoded = [(s, {k: encode(v, k) for k, v in values.items()}) for s, values in steps]
    return Signature(f"{phase}/rank-{rank}.jsonl", header, encoded, complete=True)


def loss_at(step, rank=0):
    return 1.0 / (step + rank)


def run(phase, steps, world_size=2, values=lambda s, r: {"loss": loss_at(s, r)}):
    return {
        r: sig(r, phase, [(s, values(s, r)) for s in steps], world_size) for r in range(world_size)
    }


def test_equal_runs():
    cmp = compare_runs(
        run("uninterrupted", range(1, 7)), run("resumed", range(4, 7)), split=3, steps=6
    )
    assert cmp.equal and cmp.compared_steps == 3
    assert format_comparison(cmp) == "split 3: equal on all 2 ranks over 3 steps"


def test_first_divergence_lowest_step_then_rank_then_key():
    def values(step, rank):
        out = {"a": 1.0, "loss": loss_at(step, rank), "z": 0}
        if step >= 5 and rank == 0:
            out["a"] = 2.0
        if step >= 5 and rank == 1:
            out["loss"] = 9.0
        if step == 6:
            out["z"] = 1
        return out

    base = run(
        "uninterrupted", range(1, 7), values=lambda s, r: {"a": 1.0, "loss": loss_at(s, r), "z": 0}
    )
    cmp = compare_runs(base, run("resumed", range(4, 7), values=values), 3, 6)
    div = cmp.divergence
    assert (div.step, div.rank, div.key, div.detail) == (5, 0, "a", "float differs")
    assert cmp.divergent_keys == {0: ["a"], 1: ["loss"]}
    text = format_comparison(cmp)
    assert "first divergence at step 5, rank 0, key 'a': float differs" in text
    assert "  [- uninterrupted] 1.0\n  [+ resumed]       2.0" in text
    assert "      step 4   1.0" in text  # context: the equal step before
    assert "    - step 5   1.0\n    + step 5   2.0" in text
    assert "keys that differ at step 5: rank 0: a; rank 1: loss" in text


def test_only_rank_1_differs():
    def values(step, rank):
        return {"loss": loss_at(step, rank) + (1.0 if rank == 1 else 0.0)}

    cmp = compare_runs(
        run("uninterrupted", range(1, 7)), run("resumed", range(4, 7), values=values), 3, 6
    )
    assert (cmp.divergence.step, cmp.divergence.rank) == (4, 1)
    assert cmp.divergent_keys == {1: ["loss"]}


def test_re_executed_steps():
    cmp = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", range(1, 7)), 3, 6)
    assert not cmp.equal and cmp.divergence is None
    kinds = {(p.kind, p.rank, p.steps) for p in cmp.problems}
    assert kinds == {("re-executed", 0, (1, 2, 3)), ("re-executed", 1, (1, 2, 3))}
    assert (
        "rank 0: the resumed run re-executed steps 1-3, which the checkpoint saved at step 3 had already done"
        in format_comparison(cmp)
    )


def test_shifted_missing_extra_duplicate_out_of_order():
    shifted = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", range(5, 8)), 3, 6)
    assert [p.kind for p in shifted.problems] == ["shifted", "shifted"]
    assert (
        "shifted by +1: it recorded steps 5-7 where the uninterrupted run recorded 4-6"
        in shifted.problems[0].message
    )

    missing = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", [4]), 3, 6)
    assert missing.problems[0].message.startswith(
        "rank 0: the resumed run never recorded steps 5-6 (expected every step 4-6): it stopped early"
    )
    gap = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", [4, 6]), 3, 6)
    assert (
        gap.problems[0].message
        == "rank 0: the resumed run never recorded step 5 (expected every step 4-6)"
    )

    nothing = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", []), 3, 6)
    assert nothing.problems[0].message.startswith(
        "rank 0: the resumed run recorded no steps (expected 4-6): it stopped right after loading"
    )

    off_by_one = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", range(3, 7)), 3, 6)
    assert (
        "re-executed step 3, the step the checkpoint was saved after: the global step counter was saved or restored off by one"
        in off_by_one.problems[0].message
    )

    extra = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", [4, 5, 6, 9]), 3, 6)
    assert extra.problems[0].message == "rank 0: the resumed run recorded step 9, past steps=6"

    dup = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", [4, 5, 5, 6]), 3, 6)
    assert (
        dup.problems[0].kind == "duplicate"
        and "recorded step 5 more than once" in dup.problems[0].message
    )

    disorder = compare_runs(run("uninterrupted", range(1, 7)), run("resumed", [4, 6, 5]), 3, 6)
    assert disorder.problems[0].kind == "out-of-order"

    base_short = compare_runs(run("uninterrupted", range(1, 5)), run("resumed", range(4, 7)), 3, 6)
    assert (
        base_short.problems[0].message
        == "rank 0: the uninterrupted run never recorded steps 5-6 (it must record every step 1-6)"
    )

    empty = compare_runs(run("uninterrupted", []), run("resumed", []), 3, 6)
    message = empty.problems[0].message
    assert message.startswith("rank 0: the uninterrupted run never recorded steps 4-6")
    assert "recorded no step at all" in message and "auto=False" in message
    assert "at all" not in base_short.problems[0].message


def test_missing_rank_and_missing_key():
    base = run("uninterrupted", range(1, 7))
    resumed = run("resumed", range(4, 7))
    del resumed[1]
    cmp = compare_runs(base, resumed, 3, 6)
    assert cmp.problems[0].message == "rank 1: the resumed run has no signature"

    cmp = compare_runs(
        base, run("resumed", range(4, 7), values=lambda s, r: {"loss": loss_at(s, r), "x": 1}), 3, 6
    )
    assert (cmp.divergence.key, cmp.divergence.detail) == ("x", "recorded by the resumed run only")


def test_tensors_nested_values_and_tolerance():
    def tensors(delta):
        return lambda s, r: {
            "w": torch.full((3,), float(s)) + (delta if s == 5 else 0),
            "d": {"ids": [s, r]},
        }

    base = run("uninterrupted", range(1, 7), values=tensors(0.0))
    cmp = compare_runs(base, run("resumed", range(4, 7), values=tensors(1e-3)), 3, 6)
    assert (cmp.divergence.step, cmp.divergence.key, cmp.divergence.detail) == (
        5,
        "w",
        "contents differ",
    )
    assert "tensor(float32[3] values=5, 5, 5 hash=" in readable(cmp.divergence.expected)
    assert compare_runs(
        base, run("resumed", range(4, 7), values=tensors(1e-3)), 3, 6, [("w", 0.0, 1e-2)]
    ).equal
    assert not compare_runs(
        base, run("resumed", range(4, 7), values=tensors(1e-3)), 3, 6, [("x*", 0.0, 1.0)]
    ).equal

    nested = compare_runs(
        base,
        run(
            "resumed",
            range(4, 7),
            values=lambda s, r: {**tensors(0.0)(s, r), "d": {"ids": [s, r + (s == 6)]}},
        ),
        3,
        6,
    )
    assert (nested.divergence.step, nested.divergence.path) == (6, "d['ids'][1]")
    assert "step 6, rank 0, key 'd' at d['ids'][1]: value differs" in format_comparison(nested)


def test_float_tolerance_and_nan():
    base = run("uninterrupted", range(1, 5), values=lambda s, r: {"loss": 1.0, "n": float("nan")})
    near = run("resumed", range(3, 5), values=lambda s, r: {"loss": 1.0 + 1e-9, "n": float("nan")})
    assert not compare_runs(base, near, 2, 4).equal
    assert compare_runs(base, near, 2, 4, [("loss", 1e-6, 0.0)]).equal
    assert compare_runs(
        base,
        run("resumed", range(3, 5), values=lambda s, r: {"loss": 1.0, "n": float("nan")}),
        2,
        4,
    ).equal


@pytest.mark.parametrize(
    ("steps", "text"), [([1, 2, 3], "1-3"), ([5, 1, 2, 7, 8], "1-2, 5, 7-8"), ([4], "4")]
)
def test_span(steps, text):
    assert step_ranges(steps) == text


def test_a_latent_stream_passes_with_a_note_unless_strict():
    """The stream differs after the resume, but nothing draws from it in the compared steps."""
    base = run("uninterrupted", range(1, 7), values=lambda s, r: {"loss": 1.0})
    res = run("resumed", range(4, 7), values=lambda s, r: {"loss": 1.0})
    for r in range(2):
        for step, values in base[r].steps:
            values["rng:cpu"] = "same after the split" if step >= 3 else f"s{step}"
        for _, values in res[r].steps:
            values["rng:cpu"] = "another state, idle"
    cmp = compare_runs(base, res, 3, 6)
    assert cmp.equal and cmp.latent == ["rank 0: rng:cpu", "rank 1: rng:cpu"]
    strict = compare_runs(base, res, 3, 6, strict_latent=True)
    assert not strict.equal and strict.divergence.key == "rng:cpu"


def test_ignored_keys_and_fields_are_left_out_and_listed():
    def values(s, r):
        return {"loss": 1.0}

    base = run("uninterrupted", range(1, 7), values=values)
    res = run("resumed", range(4, 7), values=values)
    for sigs, tag in ((base, "a"), (res, "b")):
        for sig in sigs.values():
            for _, v in sig.steps:
                v["rng:generator eval.py:3 #0"] = tag
                v["watch:loader.state"] = {"position": 1, "dataset_state": {"cursor": tag}}
    assert not compare_runs(base, res, 3, 6).equal
    cmp = compare_runs(
        base, res, 3, 6, ignore=["rng:generator eval.py:*", "watch:loader.state.dataset_state"]
    )
    assert cmp.equal
    assert cmp.ignored == ["rng:generator eval.py:3 #0", "watch:loader.state.dataset_state"]


def test_sample_identities_come_first_in_the_first_divergence():
    base = run("uninterrupted", range(1, 7), values=lambda s, r: {"a_loss": 1.0, "sample_ids": [s]})
    res = run("resumed", range(4, 7), values=lambda s, r: {"a_loss": 2.0, "sample_ids": [s + 9]})
    div = compare_runs(base, res, 3, 6).divergence
    assert (div.key, div.rank) == ("sample_ids", 0)


def auto_run(phase, steps, loaded=None):
    """A run recorded automatically: no value of the trainer's, and a resumed launch's
    `loaded` line (rank/auto.py numbers its first step split + 1 whatever the trainer's own
    step counter says)."""
    values = {"auto:loss": [0.5], "auto:data": [11, 12]}
    return {
        0: Signature(
            f"{phase}/rank-0.jsonl",
            {"rank": 0, "world_size": 1, "phase": phase},
            [(s, dict(values)) for s in steps],
            complete=True,
            loaded=loaded,
        )
    }


@pytest.mark.parametrize(
    "resumed_steps, words",
    [
        (
            range(4, 8),
            "took 4 optimizer steps after the split where the uninterrupted run took 3 (it "
            "recorded step 7, past steps=6): its step counter resumed at 2, not 3, so it "
            "re-executed step 3, the step the checkpoint was saved after: the global step "
            "counter was saved or restored off by one",
        ),
        (
            range(4, 10),
            "its step counter resumed at 0, not 3, so it re-executed steps 1-3, which the "
            "checkpoint saved at step 3 had already done; the resume restarted from step 1",
        ),
    ],
)
def test_extra_automatic_steps_are_a_step_counter_restored_behind(resumed_steps, words):
    """Automatic numbering cannot show a re-executed step as a repeated number: the trainer
    whose counter resumed k behind stops k optimizer steps late, and that is what it says."""
    loaded = {"split": 3, "counters": {"optimizer": 3}}
    cmp = compare_runs(
        auto_run("uninterrupted", range(1, 7)), auto_run("resumed", resumed_steps, loaded), 3, 6
    )
    assert [p.kind for p in cmp.problems] == ["re-executed"]
    assert words in cmp.problems[0].message
    explicit = compare_runs(
        run("uninterrupted", range(1, 7), 1), run("resumed", resumed_steps, 1), 3, 6
    )
    assert [p.kind for p in explicit.problems] == ["extra"]  # numbered by record(): as it was


def test_an_automatic_key_one_run_could_never_record_is_noted_never_a_divergence():
    """The issue 40 report: the resumed run recorded `auto:batch` at its first step, the
    uninterrupted run at none; the first divergence was that key. A key the other run never
    recorded at any compared step is noted; one it recorded elsewhere stays a finding."""
    from pytest_resume_equiv.checks.resume import one_sided_warning, recorded_automatically

    base = run("uninterrupted", range(1, 7), values=lambda s, r: {"auto:loss": 1.0})
    res = run(
        "resumed",
        range(4, 7),
        values=lambda s, r: {"auto:loss": 1.0, **({"auto:batch": [7]} if s == 4 else {})},
    )
    cmp = compare_runs(base, res, 3, 6)
    assert cmp.equal, cmp.divergence
    assert cmp.one_sided == [
        "auto:batch (rank 0: the resumed run only)",
        "auto:batch (rank 1: the resumed run only)",
    ]
    assert "recorded none at any compared step" in one_sided_warning(cmp)
    assert recorded_automatically([base, res], 3) == ["auto:loss"]  # not at every step
    # recorded by both runs, but not at this step of one of them: a finding
    both = run("uninterrupted", range(1, 7), values=lambda s, r: {"auto:batch": [s]})
    gap = run("resumed", range(4, 7), values=lambda s, r: {"auto:batch": [s]} if s != 5 else {})
    div = compare_runs(both, gap, 3, 6).divergence
    assert (div.step, div.key, div.detail) == (
        5,
        "auto:batch",
        "recorded by the uninterrupted run only",
    )
