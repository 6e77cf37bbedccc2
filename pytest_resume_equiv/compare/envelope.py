"""The envelope comparison: a run resumed on another topology (`resume_nproc=`,
`resume_nnodes=`), held to what a different number of ranks cannot change.

On another number of ranks the reduction order changes, so bitwise equality is not the
contract. What is:

- data: over the global batch (every rank's sample ids of a step together), the resumed run
  consumes exactly the samples the uninterrupted run consumed after the split, each once, at
  the same step (`accounting.py`); exact.
- global values: what the user recorded identically on every rank (a loss already
  all-reduced, a learning rate, a step count) is compared at every step with an envelope:
  |resumed - uninterrupted| <= ENVELOPE_FACTOR * noise + tolerance, where the noise is the
  largest |uninterrupted on the resumed topology - uninterrupted| of that value at any step,
  measured in the same test. Noise 0 (a learning rate) means exact.
- steps: every rank of the resumed run records exactly the steps after the split.

Per-rank values (a rank's own loss, RNG streams, shard fingerprints) have no counterpart on
another topology; they are listed as not compared. Pure: data in, data out; what it held
the run to is the comparison's fact (`TopologyFacts`), which renders itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.layout import WATCH, is_audit_key, section_of, watched_part
from ..signature import Signature
from . import facts
from .accounting import DataAccount, account, global_ids, is_identity_key, shared_across_ranks
from .diff import Comparison, Divergence, value_difference
from .noise import deviation, magnitude, split_value
from .step_problems import step_problems
from .tolerance import ToleranceRule, tolerance_for

ENVELOPE_FACTOR = 4.0
"""How far beyond the topology's own noise a resumed run may go: the noise is measured from
step 1 of two uninterrupted runs; a resumed run accumulates it only from the split, so a
correct resume stays well inside; a bug (another sample, a lost RNG or optimizer state)
moves values by orders of magnitude more than reduction-order rounding."""

NOT_NOISE = 1e-2
"""Relative difference between the two uninterrupted runs (one per topology) beyond which a
value's difference is not reduction-order noise (other samples, another computation): such a
difference never widens an envelope; the value is not judged (it is blind)."""

Run = dict[int, Signature]
Steps = dict[int, dict[str, Any]]


@dataclass(frozen=True)
class Envelope:
    """One global value's largest deviation, against what the topology allows."""

    key: str
    step: int
    deviation: float
    noise: float
    allowed: float

    @property
    def inside(self) -> bool:
        return self.deviation <= self.allowed

    def text(self) -> str:
        if self.deviation == 0:
            return f"{self.key} equal at every step (the topology's own noise is {self.noise:.3g})"
        return (
            f"{self.key} differs by at most {self.deviation:.3g} (step {self.step}); the "
            f"topology's own noise is {self.noise:.3g}, allowed {self.allowed:.3g}"
        )


@facts.fact("topology")
@dataclass
class TopologyFacts:
    """What a resume on another topology was held to, and how it did."""

    nproc: tuple[int, int]
    """(uninterrupted world size, resumed world size)."""
    data: list[DataAccount] = field(default_factory=list)
    envelopes: list[Envelope] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    """Global values that are not numbers (compared exactly)."""
    per_rank: list[str] = field(default_factory=list)
    """Keys with no counterpart on another topology, not compared."""
    shared: list[str] = field(default_factory=list)
    """Where several ranks of one run consumed the same sample in one step (unsharded data)."""
    blind: list[str] = field(default_factory=list)
    """Global values the two uninterrupted runs already hold apart by more than noise: no
    envelope is measured for them (it would be wide enough to hide a bug), so not judged."""

    @property
    def data_exact(self) -> bool:
        return all(a.exact for a in self.data)

    @property
    def outside(self) -> list[Envelope]:
        return [e for e in self.envelopes if not e.inside]

    def lines(self, label: str = "") -> list[str]:
        """The verdict in words: data first, then the values, then what was not compared."""
        a, b = self.nproc
        head = f"resumed on {b} rank{'s' * (b != 1)} (uninterrupted on {a}):"
        lines = [f"{label}: {head}" if label else head]
        if not self.data:
            lines.append(
                "  data: no sample ids recorded, so the data was not accounted (record each "
                "batch's sample ids, or a content hash of its rows when batches carry no "
                "index, as ids=...)"
            )
        for item in self.data:
            word = "exact" if item.exact else "NOT equivalent (a bug, not numeric noise)"
            lines.append(f"  data {word}: {item.text()}")
        lines += [f"  {text}: each rank trains on the same batch" for text in self.shared]
        for env in self.envelopes:
            where = "within the topology's noise" if env.inside else "BEYOND the topology's noise"
            lines.append(f"  {where}: {env.text()}")
        if self.exact:
            lines.append("  compared exactly (equal on every rank): " + ", ".join(self.exact))
        if self.blind:
            lines.append(
                f"  not judged (the uninterrupted runs on {a} and {b} ranks already differ "
                "beyond noise, so no envelope is measured): " + "; ".join(self.blind[:4])
            )
        if self.per_rank:
            lines.append(
                "  not compared (per-rank, no counterpart on another topology): "
                + ", ".join(self.per_rank[:8])
                + (", ..." if len(self.per_rank) > 8 else "")
            )
        return lines

    def summary(self, label: str = "") -> list[str]:
        return self.lines(label)

    def json_extra(self) -> dict[str, Any]:
        """The verdict in words, for the JSON report's readers."""
        return {"text": self.lines()}

    def judged_nothing(self) -> str:
        """Why this comparison is blind, when it could judge nothing (no data accounted, no
        value with an envelope or compared exactly) though values exist: "" otherwise."""
        if self.data or self.envelopes or self.exact or not self.blind:
            return ""
        a, b = self.nproc
        return (
            f"blind: the data could not be accounted (no sample ids recorded), and the "
            f"uninterrupted runs on {a} and {b} ranks already differ beyond noise "
            f"({self.blind[0]}), so they consumed other data or compute differently and no "
            "envelope measures noise; record each batch's sample ids (or a content hash of "
            "its rows, as ids=...) so the data is accounted over the global batch"
        )

    def unchecked(self) -> str:
        """A warning when nothing could be held to the contract (a blind comparison says so
        in its verdict instead)."""
        if self.data or self.envelopes or self.exact or self.blind:
            return ""
        return (
            "the resume on another topology compared nothing: record sample_ids (the data "
            "is accounted over the global batch) and a value equal on every rank, such as an "
            "all-reduced loss; per-rank values have no counterpart on another topology"
        )


def compare_topology(
    base: Run,
    other: Run,
    res: Run,
    split: int,
    steps: int,
    tolerance: Sequence[ToleranceRule] = (),
    skip_steps: int = 0,
) -> Comparison:
    """Hold `res` (resumed on another topology) to the uninterrupted run `base`, with `other`
    (uninterrupted on the resumed topology) giving the envelope."""
    check = TopologyFacts((len(base), len(res)))
    cmp = Comparison(split=split, steps=steps, world_size=len(res), facts=[check])
    reference = base.get(0)
    for rank, sig in sorted(res.items()):
        if reference is not None:
            cmp.problems += step_problems(rank, base.get(rank, reference), sig, split, steps)
    if cmp.problems or reference is None:
        return cmp
    first = split + 1 + skip_steps
    check.data = account(base, res, split, steps)
    for item in check.data:
        for name, run in (("uninterrupted", base), ("resumed", res)):
            found = shared_across_ranks(run, item.key)
            if found:
                step, ids = found
                check.shared.append(
                    f"the {name} run's ranks consumed the same samples at step {step} "
                    f"({item.key} {', '.join(map(str, ids[:6]))}{', ...' if len(ids) > 6 else ''})"
                )
    keys = _global_keys([base, other])
    check.per_rank = sorted(_keys(base) - keys - {k for k in _keys(base) if is_identity_key(k)})
    base_steps = reference.by_step()
    other_steps = other[0].by_step() if 0 in other else {}
    for key in sorted(keys):
        far = _beyond_noise(key, base_steps, other_steps, steps)
        if far is not None:
            check.blind.append(far)
            continue
        env = _envelope(key, base_steps, other_steps, res, first, steps, tolerance)
        if env is not None:
            check.envelopes.append(env)
        else:
            check.exact.append(key)
    cmp.compared_steps = max(0, steps - first + 1)
    cmp.divergence = _first_data_difference(base, res, check, first, steps) or _first_outside(
        base_steps, res, check, first, steps
    )
    return cmp


def _keys(run: Run) -> set[str]:
    return {k for sig in run.values() for _, values in sig.steps for k in values}


REPLICATED_PARTS = ("params", "state")
"""Watched parts that data parallelism keeps the same on every rank (DDP's parameters and
optimizer state): where they are, they are global values, comparable on any topology."""


def _global_keys(runs: list[Run]) -> set[str]:
    """The user's values, and the watched parameters and optimizer state, that are identical
    on every rank at every step of every run."""
    keys = {
        k
        for k in _keys(runs[0])
        if not is_identity_key(k)
        and (
            not is_audit_key(k) or (section_of(k) == WATCH and watched_part(k) in REPLICATED_PARTS)
        )
    }
    for run in runs:
        by_rank = [sig.by_step() for _, sig in sorted(run.items())]
        for steps in by_rank[1:]:
            for step, values in steps.items():
                first = by_rank[0].get(step, {})
                keys = {k for k in keys if values.get(k) == first.get(k)}
    return keys


def _deviation(a: Any, b: Any) -> Optional[float]:
    """The largest difference between the numbers of two values (a float, a tensor's values or
    statistics, a watched object's fingerprints by their statistics), None when they hold no
    number or differ in something else (`noise.deviation`)."""
    return deviation(a, b) if split_value(a)[0] else None


def _beyond_noise(key: str, base: Steps, other: Steps, steps: int) -> Optional[str]:
    """Where the two uninterrupted runs hold a numeric value apart by more than noise
    (`NOT_NOISE`, relative), in words; None when they do not."""
    for step in range(1, steps + 1):
        a, b = base.get(step, {}).get(key), other.get(step, {}).get(key)
        found = _deviation(a, b)
        if found is None:
            return None
        scale = max(magnitude(a), magnitude(b))
        if found > NOT_NOISE * scale and found > 0:
            return f"{key} relative {found / scale if scale else math.inf:.2g} at step {step}"
    return None


def _envelope(
    key: str,
    base: Steps,
    other: Steps,
    res: Run,
    first: int,
    steps: int,
    tolerance: Sequence[ToleranceRule],
) -> Optional[Envelope]:
    """The largest deviation of `key` over the resumed ranks and steps, against its noise;
    None when it is not numeric (compared exactly by `_first_outside`)."""
    noise = 0.0
    for step in range(1, steps + 1):
        found = _deviation(base.get(step, {}).get(key), other.get(step, {}).get(key))
        if found is None:
            return None
        noise = max(noise, found)
    rtol, atol = tolerance_for(key, tolerance) or (0.0, 0.0)
    worst = Envelope(key, first, 0.0, noise, ENVELOPE_FACTOR * noise + atol)
    for step in range(first, steps + 1):
        expected = base[step].get(key)
        allowed = ENVELOPE_FACTOR * noise + atol + rtol * magnitude(expected)
        for sig in res.values():
            dev = _deviation(expected, sig.by_step().get(step, {}).get(key))
            if dev is None:
                dev = math.inf
            if dev - allowed > worst.deviation - worst.allowed:
                worst = Envelope(key, step, dev, noise, allowed)
    return worst


def _first_data_difference(
    base: Run, res: Run, check: TopologyFacts, first: int, steps: int
) -> Optional[Divergence]:
    """The first step whose global batch holds other samples."""
    for item in check.data:
        if item.exact:
            continue
        ours = global_ids(res, item.key, range(first, steps + 1)) or {}
        theirs = global_ids(base, item.key, range(first, steps + 1)) or {}
        for step in range(first, steps + 1):
            if sorted(ours.get(step, [])) != sorted(theirs.get(step, [])):
                return Divergence(
                    step,
                    0,
                    item.key,
                    item.key,
                    theirs.get(step),
                    ours.get(step),
                    "the global batch (every rank's ids together) holds other samples",
                )
    return None


def _first_outside(
    base: Steps, res: Run, check: TopologyFacts, first: int, steps: int
) -> Optional[Divergence]:
    """The first step at which a global value leaves its envelope, or a non-numeric global
    value differs."""
    envelopes = {e.key: e for e in check.envelopes}
    keys = sorted({e.key for e in check.outside} | set(check.exact))
    for step in range(first, steps + 1):
        for key in keys:
            expected = base[step].get(key)
            for rank, sig in sorted(res.items()):
                actual = sig.by_step().get(step, {}).get(key)
                if key in envelopes:
                    env = envelopes[key]
                    dev = _deviation(expected, actual)
                    dev = math.inf if dev is None else dev
                    if dev <= env.allowed:
                        continue
                    why = (
                        f"beyond the topology's noise: differs by {dev:.3g}, allowed "
                        f"{env.allowed:.3g} ({ENVELOPE_FACTOR:g} x its noise {env.noise:.3g})"
                    )
                elif value_difference(expected, actual, key, None) is None:
                    continue
                else:
                    why = "a value equal on every rank differs"
                return Divergence(step, rank, key, key, expected, actual, why)
    return None
