"""A resume on another topology, judged on hand-made signatures: the data exactly over the
global batch, values equal on every rank within the topology's own noise."""

from test_compare import sig

from pytest_resume_equiv.compare.envelope import ENVELOPE_FACTOR, compare_topology
from pytest_resume_equiv.diagnose import Stage, cause

STEPS, SPLIT, BATCH = 6, 3, 4


def global_ids(step):
    return [(step - 1) * BATCH + k for k in range(BATCH)]


def run(phase, world, steps, loss=lambda s: 1.0 / s, ids=global_ids, extra=None):
    """Every rank records the global loss and its share of the global batch (every W-th id)."""
    out = {}
    for rank in range(world):
        records = []
        for s in steps:
            values = {"loss": loss(s), "sample_ids": ids(s)[rank::world]}
            values.update((extra or (lambda s, r: {}))(s, rank))
            records.append((s, values))
        out[rank] = sig(rank, phase, records, world)
    return out


def judge(res, base=None, other=None):
    base = base or run("uninterrupted", 2, range(1, STEPS + 1))
    other = other or run("topology", 1, range(1, STEPS + 1), loss=lambda s: 1.0 / s + 1e-6)
    cmp = compare_topology(base, other, res, SPLIT, STEPS)
    (held,) = cmp.facts  # what the envelope comparator held the run to
    return cmp, held


def test_within_the_topology_noise_and_every_sample_once_is_equivalent():
    cmp, check = judge(run("resumed", 1, range(4, 7), loss=lambda s: 1.0 / s + 2e-6))
    assert cmp.equal, cmp
    assert check.data_exact and [e.key for e in check.envelopes] == ["loss"]
    (env,) = check.envelopes
    assert env.inside and abs(env.noise - 1e-6) < 1e-9
    assert abs(env.allowed - ENVELOPE_FACTOR * env.noise) < 1e-12
    assert "within the topology's noise: loss differs by at most" in "\n".join(check.lines())


def test_beyond_the_noise_with_exact_data_fails_with_the_cause_unknown():
    cmp, check = judge(run("resumed", 1, range(4, 7), loss=lambda s: 1.0 / s + 1e-3))
    assert not cmp.equal and cmp.divergence.key == "loss" and cmp.divergence.step == 4
    assert "beyond the topology's noise" in cmp.divergence.detail
    diagnosis = cause(Stage.TOPOLOGY, (cmp, check))
    assert diagnosis.bug_class == "unknown" and "cause unknown" in diagnosis.text()


def test_samples_skipped_per_process_are_named_before_any_value():
    # resumed on 1 rank from a cursor counted per process: half the samples again
    shifted = lambda s: global_ids(s - 2)  # noqa: E731
    cmp, check = judge(run("resumed", 1, range(4, 7), loss=lambda s: 5.0, ids=shifted))
    assert not check.data_exact
    (account,) = check.data
    assert account.missing == list(range(16, 24))  # steps 5-6 of the uninterrupted run
    assert "ids 16-23 never seen" in account.text()
    assert cmp.divergence.key == "sample_ids" and cmp.divergence.step == 4
    diagnosis = cause(Stage.TOPOLOGY, (cmp, check))
    assert diagnosis.bug_class == "data order" and "not numeric noise" in diagnosis.text()
    assert "started from an earlier place in the data" in diagnosis.notes[0]


def test_a_value_without_topology_noise_must_be_exact():
    lr = lambda s, r: {"lr": 0.1 * s}  # noqa: E731
    base = run("uninterrupted", 2, range(1, 7), extra=lr)
    other = run("topology", 1, range(1, 7), extra=lr)
    off = run("resumed", 1, range(4, 7), extra=lambda s, r: {"lr": 0.1 * s + 1e-12})
    cmp, check = judge(off, base, other)
    assert cmp.divergence.key == "lr"
    lr_env = next(e for e in check.envelopes if e.key == "lr")
    assert lr_env.noise == 0 and not lr_env.inside


def test_per_rank_values_are_listed_and_not_compared():
    per_rank = lambda s, r: {"local_loss": float(s * 10 + r)}  # noqa: E731
    base = run("uninterrupted", 2, range(1, 7), extra=per_rank)
    res = run("resumed", 1, range(4, 7), extra=lambda s, r: {"local_loss": -1.0})
    cmp, check = judge(res, base)
    assert cmp.equal and check.per_rank == ["local_loss"]
    assert "not compared (per-rank" in "\n".join(check.lines())


def test_nothing_comparable_is_a_warning():
    no_ids = lambda s: []  # noqa: E731
    per_rank = lambda s, r: {"local_loss": float(s * 10 + r)}  # noqa: E731
    base = run("uninterrupted", 2, range(1, 7), loss=lambda s: 0, ids=no_ids, extra=per_rank)
    for sig_ in base.values():
        for _, values in sig_.steps:
            del values["loss"], values["sample_ids"]
    other = {0: base[0]}
    res = {0: sig(0, "resumed", [(s, {"local_loss": 1.0}) for s in range(4, 7)], 1)}
    (check,) = compare_topology(base, other, res, SPLIT, STEPS).facts
    assert "compared nothing" in check.unchecked()


def test_missing_steps_on_a_resumed_rank_are_step_problems():
    res = run("resumed", 1, range(4, 6))
    cmp, _ = judge(res)
    assert cmp.problems and not cmp.equal


def test_ranks_that_share_samples_are_named_instead_of_a_per_process_skip():
    # each of the 2 uninterrupted ranks trained on the whole global batch (not sharded)
    base = {
        r: sig(r, "uninterrupted", [(s, {"sample_ids": global_ids(s)}) for s in range(1, 7)], 2)
        for r in range(2)
    }
    res = run("resumed", 1, range(4, 7))
    cmp = compare_topology(base, base, res, SPLIT, STEPS)
    (check,) = cmp.facts
    assert not cmp.equal and check.data[0].fewer == list(range(12, 24))
    assert "seen fewer times than in the uninterrupted run" in check.data[0].text()
    note = cause(Stage.TOPOLOGY, (cmp, check)).notes[0]
    assert "ranks consumed the same samples at step 1" in note and "not sharded" in note


def test_parameters_replicated_on_every_rank_are_held_to_the_envelope_too():
    """DDP keeps the watched parameters the same on every rank: on another topology they are
    global values, so weights that drift beyond the topology's noise fail even when the loss
    stays inside (rank 1's saved batch and stream dropped on a resume onto one rank)."""

    def params(drift):
        def extra(s, rank):
            w = 0.5 + 0.01 * s + drift(s)
            return {"watch:model.params": {"w": {"hash": f"h{s}{drift(s)}", "norm": w}}}

        return extra

    base = run("uninterrupted", 2, range(1, STEPS + 1), extra=params(lambda s: 0.0))
    other = run("topology", 1, range(1, STEPS + 1), extra=params(lambda s: 1e-7))
    good = run("resumed", 1, range(4, 7), extra=params(lambda s: 2e-7))
    cmp, check = judge(good, base, other)
    assert cmp.equal, cmp
    assert "watch:model.params" in [e.key for e in check.envelopes]
    bad = run("resumed", 1, range(4, 7), extra=params(lambda s: 1.2e-3))
    cmp, _ = judge(bad, base, other)
    assert not cmp.equal and cmp.divergence.key == "watch:model.params"
    assert "beyond the topology's noise" in cmp.divergence.detail


def without_ids(phase, world, steps, loss):
    """Every rank records only the global loss: no sample ids."""
    return {
        rank: sig(rank, phase, [(s, {"loss": loss(s)}) for s in steps], world)
        for rank in range(world)
    }


def test_topologies_that_differ_beyond_noise_without_ids_are_blind_not_widened():
    """Issue 30, item 4: the uninterrupted runs on 2 and 1 ranks consume other data (their
    losses differ by 30%); no ids say so. No envelope is measured from that difference, and
    the comparison says it is blind instead of judging (a mutated run would pass it)."""
    base = without_ids("uninterrupted", 2, range(1, STEPS + 1), lambda s: 1.0 / s)
    other = without_ids("topology", 1, range(1, STEPS + 1), lambda s: 1.3 / s)
    mutated = without_ids("teeth", 1, range(4, STEPS + 1), lambda s: 1.2 / s)
    cmp, check = judge(mutated, base, other)
    assert check.envelopes == [] and check.blind and check.blind[0].startswith("loss relative")
    why = check.judged_nothing()
    assert why.startswith("blind: the data could not be accounted (no sample ids recorded)")
    assert "content hash of its rows" in why
    assert "not judged (the uninterrupted runs on 2 and 1 ranks" in "\n".join(check.lines())


def test_noise_between_topologies_still_makes_an_envelope():
    base = without_ids("uninterrupted", 2, range(1, STEPS + 1), lambda s: 1.0 / s)
    other = without_ids("topology", 1, range(1, STEPS + 1), lambda s: 1.0 / s + 1e-6)
    cmp, check = judge(
        without_ids("resumed", 1, range(4, STEPS + 1), lambda s: 1.0 / s), base, other
    )
    assert cmp.equal and [e.key for e in check.envelopes] == ["loss"] and not check.blind
    assert check.judged_nothing() == ""


def test_a_blind_topology_verdict_abstains_saying_why():
    from pytest_resume_equiv.checks.other_topology import judge_topology
    from pytest_resume_equiv.compare.tolerance import ComparisonRules

    base = without_ids("uninterrupted", 2, range(1, STEPS + 1), lambda s: 1.0 / s)
    other = without_ids("topology", 1, range(1, STEPS + 1), lambda s: 1.3 / s)
    res = without_ids("resumed", 1, range(4, STEPS + 1), lambda s: 1.0 / s)
    verdict = judge_topology(base, res, other, SPLIT, ComparisonRules(STEPS))
    assert verdict.status == "abstained" and verdict.why.startswith("blind: ")
