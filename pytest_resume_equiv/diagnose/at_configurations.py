"""The causes of a difference between two configurations of one training (`@equivalent`,
`Stage.CONFIGURATION`), each read from what the ranks recorded (rank/sketch.py) and told
apart from its look-alikes by evidence only it leaves:

- what a trainer did to the gradients between two backwards of one window (zeroed them,
  scaled them), seen as the gradient's norm before a backward against after the last one;
- what happened between the last backward and the optimizer step on each rank (a clipping:
  one factor for every rank when it clips by the whole gradient, its own per rank when each
  clips by its shards);
- the schedulers' counters against the backwards of a step, each rank's samples, each rank's
  buffers, each micro-batch's tokens;
- the gradient of the first step's window (both configurations start from the same
  parameters there: like with like) as a multiple of the baseline's, the accumulation or the
  world size.

With dropout kept (`dropout="on"`), a difference is first the masks' and blames no code. With
no evidence that separates a cause, the cause is unknown, and the report says what differs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Optional

from ..compare.configurations import ConfigurationFacts
from .classes import (
    CLIPPING_ON_LOCAL_SHARDS,
    CLIPPING_PER_MICRO_STEP,
    DRAWN_BY_CONSTRUCTION,
    GRADIENTS_ZEROED_IN_WINDOW,
    LOSS_NOT_SCALED_BY_ACCUMULATION,
    LOSS_SCALED_BY_WORLD_SIZE,
    TOKEN_MEAN_PER_MICRO_BATCH,
    UNKNOWN,
)
from .config_evidence import ROLES, SAME, STAGE, close, first_step, runs, until_first
from .rules import Finding, Rule

# -- dropout kept: the masks differ by construction ---------------------------------------


def drawn_by_construction(facts: ConfigurationFacts) -> Optional[Finding]:
    """dropout="on" and dropout drew masks in either run by the first differing step: masks
    drawn per micro-batch or rank cannot equal the big batch's, so no code is to blame."""
    if not facts.dropout.get("drawn") or facts.equal:
        return None
    counts = {role: 0 for role in ROLES}
    for role, _, g in until_first(facts):
        counts[role] += sum(r.dropout for r in g.ranks.values())
    if not any(counts.values()):
        return None
    return Finding("", {"calls": counts, "step": first_step(facts)})


def _drawn_words(f: Finding) -> str:
    calls = f["calls"]
    return (
        f"dropout drew masks before the first difference (step {f['step']}): "
        f"{calls['baseline']} calls in the baseline, {calls['variant']} in the variant; masks "
        "drawn per micro-batch or per rank cannot equal the big batch's, so the configurations "
        "cannot be compared with dropout on, and no code is blamed"
    )


# -- what the trainer did to the gradients between two backwards -------------------------


def _between_backwards(facts: ConfigurationFacts) -> Iterator[tuple[str, int, int, int, float]]:
    """(run, step, rank, backward, factor): the gradient's norm before backward `backward`
    (from 2) as a factor of its norm after the previous one, where they differ."""
    for role, step, g in until_first(facts):
        for rank, r in sorted(g.ranks.items()):
            for i in range(1, min(len(r.before), len(r.after) + 1)):
                after, before = r.after[i - 1], r.before[i]
                if after > 0 and not close(before, after, SAME):
                    yield role, step, rank, i + 1, math.sqrt(before / after)


def zeroed_in_window(facts: ConfigurationFacts) -> Optional[Finding]:
    """A rank's gradients were non-zero after one backward of a step and zero before its next
    one: they were zeroed inside the accumulation window, so the step's gradient is the last
    micro-batch's alone."""
    for role, step, rank, backward, factor in _between_backwards(facts):
        if factor == 0:
            backwards = len(facts.steps_of(role)[step].ranks[rank].losses)
            return Finding(
                f"{role}, step {step}, rank {rank}",
                {"role": role, "step": step, "backward": backward, "backwards": backwards},
            )
    return None


def _zeroed_words(f: Finding) -> str:
    return (
        f"the gradients were zeroed between backward {f['backward'] - 1} and {f['backward']} of "
        f"the step's {f['backwards']} (their norm was 0 when backward {f['backward']} began): "
        "the stepped gradient is the last micro-batch's alone"
    )


def clipped_in_window(facts: ConfigurationFacts) -> Optional[Finding]:
    """A rank's gradients were scaled down (not zeroed) between two backwards of one step: a
    clipping inside the accumulation window, which clips partial sums and bites otherwise
    than once on the window's gradient."""
    for role, step, rank, backward, factor in _between_backwards(facts):
        if 0 < factor < 1:
            return Finding(
                f"{role}, step {step}, rank {rank}",
                {"role": role, "step": step, "backward": backward, "factor": round(factor, 4)},
            )
    return None


def _clipped_in_window_words(f: Finding) -> str:
    return (
        f"the gradients were scaled by {f['factor']:g} between backward {f['backward'] - 1} "
        f"and {f['backward']} (inside the accumulation window): clipping per micro-step, "
        "which clips partial sums; the stepped gradient's norm differs where clipping bites"
    )


# -- between the last backward and the optimizer step ---------------------------------------


def clipped_by_own_shards(facts: ConfigurationFacts) -> Optional[Finding]:
    """Between the last backward and the optimizer step the ranks scaled their gradients by
    different factors, at least one below 1: each rank clipped by the norm of its own shards,
    not of the whole gradient (one factor for all when it clips by the whole gradient)."""
    for role, step, g in until_first(facts):
        factors = {
            rank: math.sqrt(r.stepped / r.window)
            for rank, r in sorted(g.ranks.items())
            if r.stepped is not None and r.window
        }
        values = list(factors.values())
        if len(values) > 1 and min(values) < 1 - SAME and not close(min(values), max(values)):
            shown = {str(k): round(v, 4) for k, v in factors.items()}
            return Finding(f"{role}, step {step}", {"role": role, "factors": shown})
    return None


def _own_shards_words(f: Finding) -> str:
    factors = ", ".join(f"rank {r} x{v:g}" for r, v in f["factors"].items())
    return (
        f"between the last backward and the optimizer step each rank scaled its gradient by "
        f"its own factor ({factors}): clipping by each rank's own shards' norm, not the whole "
        "gradient's (the stepped gradient differs only where clipping bites)"
    )


# -- the step's loss and gradient as functions of the batching -------------------------------


def token_mean_per_micro_batch(facts: ConfigurationFacts) -> Optional[Finding]:
    """With token counts recorded per micro-batch, the run's backward losses weighted by their
    tokens (each times its rank's backwards: a micro-batch's own token mean) give the other
    run's loss at the first differing step, and unweighted they do not: a mean of per-micro-
    batch token means, not the global batch's token mean."""
    step = first_step(facts)
    for role, steps in runs(facts):
        other = facts.steps_of("baseline" if role == "variant" else "variant").get(step)
        g = steps.get(step)
        if g is None or other is None or "loss" not in other.numbers:
            continue
        ranks = list(g.ranks.values())
        if not ranks or any(len(r.tokens) != len(r.losses) or not r.losses for r in ranks):
            continue
        if any(n <= 0 for r in ranks for n in r.tokens):
            continue
        weighted = sum(r.backwards * x * n for r in ranks for x, n in zip(r.losses, r.tokens))
        weighted /= sum(n for r in ranks for n in r.tokens)
        target, plain = other.numbers["loss"], g.numbers.get("loss", math.nan)
        if close(weighted, target, 1e-5) and not close(plain, target, 1e-5):
            tokens = [int(n) for r in ranks for n in r.tokens]
            evidence = {"role": role, "tokens": tokens[:8], "loss": [plain, weighted, target]}
            return Finding(f"{role}, step {step}", evidence)
    return None


def _token_words(f: Finding) -> str:
    plain, weighted, target = f["loss"]
    return (
        f"the step's loss {plain:.6g} is a mean of the micro-batches' own token means (their "
        f"tokens: {', '.join(map(str, f['tokens']))}); weighted by their token counts they give "
        f"{weighted:.6g}, the other configuration's {target:.6g}: a per-micro-batch token mean"
    )


def _window_ratio(facts: ConfigurationFacts, by_ranks: bool) -> Optional[Finding]:
    """At the first step both recorded (the same parameters in both, the same samples: like
    with like), one run's window gradient is the other's times their ratio of backwards per
    step (`by_ranks`: of ranks), that ratio above 1 and not the other one. The run with the
    larger gradient is named."""
    both = sorted(set(facts.baseline_steps) & set(facts.variant_steps))
    if not both or facts.equal:
        return None
    step = both[0]
    a, b = facts.baseline_steps[step], facts.variant_steps[step]
    if a.samples != b.samples or not a.ranks or not b.ranks:
        return None
    ga = a.whole({n: r.window for n, r in a.ranks.items()})
    gb = b.whole({n: r.window for n, r in b.ranks.items()})
    ka, kb = a.ranks[min(a.ranks)].backwards, b.ranks[min(b.ranks)].backwards
    if not ga or not gb or not ka or not kb:
        return None
    backwards = (kb / ka, (kb, ka))
    ranks = (len(b.ranks) / len(a.ranks), (len(b.ranks), len(a.ranks)))
    (k, counts), (o, _) = (ranks, backwards) if by_ranks else (backwards, ranks)
    for role, ratio, factor, other, (mine, theirs) in (
        ("variant", gb / ga, k, o, counts),
        ("baseline", ga / gb, 1 / k, 1 / o, counts[::-1]),
    ):
        if factor > 1 and not close(factor, other) and close(ratio, factor):
            evidence = {"role": role, "ratio": round(ratio, 4), "counts": [mine, theirs]}
            return Finding(f"step {step}", evidence)
    return None


def loss_not_scaled_by_accumulation(facts: ConfigurationFacts) -> Optional[Finding]:
    """At the first step (the same parameters and samples in both) one run's window gradient
    is the other's times their ratio of backwards per step, which is not their ratio of
    ranks: its micro-batches' losses are not divided by the accumulation steps."""
    return _window_ratio(facts, by_ranks=False)


def _others(role: str) -> str:
    return "baseline" if role == "variant" else "variant"


def _accumulation_words(f: Finding) -> str:
    mine, theirs = f["counts"]
    return (
        f"the gradient of the {f['role']}'s window is {f['ratio']:g} times the "
        f"{_others(f['role'])}'s, their ratio of backwards per step ({mine} against {theirs}): "
        f"the {f['role']}'s micro-batch losses are not divided by the accumulation steps"
    )


def loss_scaled_by_world_size(facts: ConfigurationFacts) -> Optional[Finding]:
    """At the first step one run's window gradient is the other's times their ratio of
    ranks, which is not their ratio of backwards per step: its loss is multiplied by the
    world size although data parallelism averages the gradients."""
    return _window_ratio(facts, by_ranks=True)


def _world_words(f: Finding) -> str:
    mine, theirs = f["counts"]
    return (
        f"the gradient of the {f['role']}'s window is {f['ratio']:g} times the "
        f"{_others(f['role'])}'s, their ratio of ranks ({mine} against {theirs}): the "
        f"{f['role']}'s loss is scaled by the world size, although data parallelism averages "
        "the gradients over the ranks"
    )


def unexplained(facts: ConfigurationFacts) -> Optional[Finding]:
    """The configurations differ and nothing recorded separates a cause."""
    if facts.equal:
        return None
    first = facts.differences[0]
    return Finding("", {"what": first.what, "step": first.step})


def _unexplained_words(f: Finding) -> str:
    return (
        f"{f['what']} differs first, at step {f['step']}, and nothing recorded separates a "
        "cause (the gradients between backwards, the schedulers' counters, each rank's samples "
        "and buffers, the token counts): cause unknown"
    )


RULES: tuple[Rule[ConfigurationFacts], ...] = (
    Rule("configuration.dropout-drawn", STAGE, DRAWN_BY_CONSTRUCTION,
         drawn_by_construction, _drawn_words),
    Rule("configuration.zeroed-in-window", STAGE, GRADIENTS_ZEROED_IN_WINDOW,
         zeroed_in_window, _zeroed_words, after=("configuration.other-samples",)),
    Rule("configuration.clipped-in-window", STAGE, CLIPPING_PER_MICRO_STEP,
         clipped_in_window, _clipped_in_window_words,
         after=("configuration.zeroed-in-window",)),
    Rule("configuration.clipped-by-own-shards", STAGE, CLIPPING_ON_LOCAL_SHARDS,
         clipped_by_own_shards, _own_shards_words, after=("configuration.clipped-in-window",)),
    Rule("configuration.token-mean-per-micro-batch", STAGE, TOKEN_MEAN_PER_MICRO_BATCH,
         token_mean_per_micro_batch, _token_words,
         after=("configuration.other-samples", "configuration.per-rank-buffers")),
    Rule("configuration.loss-not-scaled-by-accumulation", STAGE,
         LOSS_NOT_SCALED_BY_ACCUMULATION, loss_not_scaled_by_accumulation,
         _accumulation_words, after=("configuration.token-mean-per-micro-batch",)),
    Rule("configuration.loss-scaled-by-world-size", STAGE, LOSS_SCALED_BY_WORLD_SIZE,
         loss_scaled_by_world_size, _world_words,
         after=("configuration.token-mean-per-micro-batch",)),
    Rule("configuration.unexplained", STAGE, UNKNOWN, unexplained, _unexplained_words,
         always=True),
)  # fmt: skip
