"""Two configurations of the same training (another batching or parallelism), compared per
optimizer step over the global batch: every rank's records of the step together.

Exactly: the optimizer's and the schedulers' step counts, the learning rates, and the
samples the step consumed (a multiset of sample ids over every rank and micro-batch, or of
the automatic input fingerprints). Within round-off: the step's loss (the losses given to
`backward()` in the step, summed over its micro-batches and averaged over ranks, which is
what a data-parallel optimizer steps on), and the parameters and buffers after the step
(their norm and mean). Round-off is bounded from the runs themselves: a sum of n terms in
another order moves by at most about n units in the last place of its dtype, and a step's
reductions sum over its global batch; the bound grows with the steps already taken.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.encode import decode_float
from ..rank.layout import AUTO, WATCH, audit_key, is_audit_key, section_of, watched
from ..signature import Signature, scalar
from . import facts
from .accounting import BATCH_KEY, CONTENT_KEY, ids_of, is_identity_key

Run = dict[int, Signature]
LOSS_KEY = audit_key(AUTO, "loss")
FLOAT32_EPS = 2.0**-24
"""Float32's unit roundoff: what the records' floats (float32 tensors, statistics of them)
resolve."""
EXACT_PARTS = ("lr", "last_lr", "last_epoch")
"""Watched parts every configuration must give the same at every step."""
FLOAT_PARTS = ("params", "buffers")
SHOWN = 5
"""Differences listed in a report, the first of each quantity in step order."""


@dataclass
class Difference:
    """The first step at which a quantity differs between the configurations."""

    what: str
    step: int
    baseline: Any
    variant: Any
    relative: Optional[float] = None
    """For a number: the relative difference (against `bound`)."""
    bound: Optional[float] = None

    def text(self) -> str:
        size = (
            f" (relative {self.relative:.2g}, round-off bound {self.bound:.2g})"
            if self.relative is not None and self.bound is not None
            else ""
        )
        return (
            f"step {self.step}: {self.what}: baseline {_show(self.baseline)}, variant "
            f"{_show(self.variant)}{size}"
        )


def _show(value: Any) -> str:
    return f"{value:.9g}" if isinstance(value, float) else str(value)


@facts.fact("configurations")
@dataclass
class ConfigurationFacts:
    """What the comparison of two configurations found: the differences (the first step of
    each quantity), the steps compared, and the largest round-off-level difference seen."""

    baseline: str
    variant: str
    steps: int = 0
    differences: list[Difference] = field(default_factory=list)
    largest: float = 0.0
    """The largest relative difference of a number within its bound (what round-off did)."""
    samples_key: str = ""

    @property
    def equal(self) -> bool:
        return not self.differences

    def lines(self, label: str) -> list[str]:
        head = f"{label}: {self.variant} against the baseline {self.baseline}"
        if self.equal:
            return [
                f"{head}: equal over {self.steps} steps (exactly: step counts, learning rates, "
                f"samples ({self.samples_key or 'none recorded'}); within round-off: loss, "
                f"parameters; largest relative difference {self.largest:.2g})"
            ]
        shown = self.differences[:SHOWN]
        more = len(self.differences) - len(shown)
        tail = [f"  (and {more} more quantities differ)"] if more else []
        return [f"{head}: differs", *(f"  {d.text()}" for d in shown), *tail]

    def summary(self, label: str) -> list[str]:
        return []


def compare_configurations(
    baseline: Run, variant: Run, steps: int, names: tuple[str, str] = ("", "")
) -> ConfigurationFacts:
    """Every optimizer step of both runs, over the global batch."""
    found = ConfigurationFacts(*names)
    a, b = _global(baseline), _global(variant)
    found.samples_key = _samples_key(baseline)
    for step in range(1, steps + 1):
        if step not in a or step not in b:
            recorded = ("recorded" if step in a else "none", "recorded" if step in b else "none")
            found.differences.append(Difference("the step's records", step, *recorded))
            break
        found.steps = step
        _exact(found, step, a[step], b[step])
        _round_off(found, step, a[step], b[step])
    if not any(a[s].samples or a[s].numbers or a[s].exact for s in a):
        found.differences.append(
            Difference("nothing recorded to compare", 1, "no samples, loss or parameters", "")
        )
    firsts: dict[str, Difference] = {}
    for difference in found.differences:  # one line per quantity: its first difference
        firsts.setdefault(difference.what, difference)
    found.differences = list(firsts.values())
    return found


@dataclass
class GlobalStep:
    """One optimizer step over every rank: what must be equal, and the numbers."""

    exact: dict[str, Any] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)
    samples: Counter = field(default_factory=Counter)
    batch: int = 0


def _global(run: Run) -> dict[int, GlobalStep]:
    steps: dict[int, GlobalStep] = {}
    key = _samples_key(run)
    losses: dict[int, list[float]] = {}
    tensors: dict[int, dict[str, list[dict]]] = {}
    first = min(run, default=0)
    for rank in sorted(run):
        for step, values in run[rank].steps:
            g = steps.setdefault(step, GlobalStep())
            ids = ids_of(values.get(key)) if key else None
            g.samples.update(ids or [])
            g.batch = sum(g.samples.values())
            loss = values.get(LOSS_KEY)
            if isinstance(loss, list):
                numbers = [scalar(v) for v in loss]
                losses.setdefault(step, []).append(sum(n for n in numbers if n is not None))
            for name, stats in _tensors(values).items():
                tensors.setdefault(step, {}).setdefault(name, []).append(stats)
            if rank == first:
                _rank_zero(g, values)
    for step, sums in losses.items():
        steps[step].numbers["loss"] = sum(sums) / len(sums)
    for step, by_name in tensors.items():
        for name, per_rank in by_name.items():
            steps[step].numbers.update(_whole(name, per_rank))
    return steps


def _tensors(values: dict[str, Any]) -> dict[str, dict]:
    """A rank's parameters and buffers (of the watched objects that are no optimizer), by a
    name the wrappers of another configuration do not change: their statistics."""
    optimizers = {watched(k)[0] for k in values if section_of(k) == WATCH and k.endswith(".lr")}
    found = {}
    for key, value in values.items():
        if section_of(key) != WATCH or not isinstance(value, dict):
            continue
        obj, part = watched(key)
        if part in FLOAT_PARTS and obj not in optimizers:
            for name, tensor in value.items():
                if isinstance(tensor, dict):
                    found[f"{obj}.{part}[{_plain(name)!r}]"] = tensor
    return found


def _whole(name: str, per_rank: list[dict]) -> dict[str, float]:
    """A tensor's statistics over the whole of it: one rank's where every rank holds the same
    (replicated: data parallel), else its shards' combined (sharded: FSDP, each rank's
    statistics of its own shard): the norm as the root of the squares' sum, the absmax as
    the largest."""
    # magnitudes only: a mean near zero moves by a large fraction of itself under round-off
    norms = [decode_float(t.get("norm")) for t in per_rank]
    tops = [decode_float(t.get("absmax")) for t in per_rank]
    if any(x is None for x in norms + tops):
        return {}
    if all(t == per_rank[0] for t in per_rank):
        norm, top = norms[0], tops[0]
    else:
        norm, top = math.sqrt(sum(x * x for x in norms)), max(tops)
    return {f"{name}.norm": norm, f"{name}.absmax": top}


def _rank_zero(g: GlobalStep, values: dict[str, Any]) -> None:
    """The values every rank holds alike (rank 0's): learning rates, scheduler counters,
    optimizer step counts."""
    for key, value in values.items():
        if section_of(key) != WATCH:
            continue
        obj, part = watched(key)
        if part in EXACT_PARTS:
            g.exact[key] = value
        elif part == "state" and isinstance(value, dict):
            counts = {scalar(v.get("step")) for v in value.values() if isinstance(v, dict)}
            g.exact[f"{obj}'s step count"] = sorted(c for c in counts if c is not None)


WRAPPERS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
"""Prefixes a parallel or compiled wrapper adds to a parameter's name (DDP, torch.compile,
FSDP1, activation checkpointing): the same parameter under two configurations."""


def _plain(name: str) -> str:
    while True:
        for prefix in WRAPPERS:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        else:
            return name.replace("._orig_mod.", ".").replace("._fsdp_wrapped_module.", ".")


def _samples_key(run: Run) -> str:
    """The identity key the samples are counted by: the trainer's sample ids, else the
    model's inputs (every forward's: a window of micro-batches fetched ahead gives the
    loader's batches to its first forward only), else the batches a DataLoader yielded."""
    keys = {k for sig in run.values() for _, values in sig.steps for k in values}
    own = sorted(k for k in keys if not is_audit_key(k) and is_identity_key(k))
    if own:
        return own[0]
    return next((k for k in (CONTENT_KEY, BATCH_KEY) if k in keys), "")


def _exact(found: ConfigurationFacts, step: int, a: GlobalStep, b: GlobalStep) -> None:
    if a.samples != b.samples:
        only_a, only_b = a.samples - b.samples, b.samples - a.samples
        found.differences.append(
            Difference(
                f"samples consumed ({found.samples_key}, over every rank and micro-batch)",
                step,
                f"{sum(a.samples.values())} samples, {sum(only_a.values())} not in the variant's",
                f"{sum(b.samples.values())} samples, {sum(only_b.values())} not in the "
                f"baseline's, {sum(c - 1 for c in b.samples.values() if c > 1)} repeated",
            )
        )
    for key in sorted(set(a.exact) | set(b.exact)):
        if a.exact.get(key) != b.exact.get(key):
            found.differences.append(Difference(key, step, a.exact.get(key), b.exact.get(key)))


def _round_off(found: ConfigurationFacts, step: int, a: GlobalStep, b: GlobalStep) -> None:
    """Numbers within `bound` relative: FLOAT32_EPS x the global batch x the steps taken."""
    bound = FLOAT32_EPS * max(a.batch, 1) * step
    for key in sorted(set(a.numbers) & set(b.numbers)):
        x, y = a.numbers[key], b.numbers[key]
        scale = max(abs(x), abs(y))
        relative = abs(x - y) / scale if scale > 0 else 0.0
        if not math.isfinite(relative) or relative > bound:
            found.differences.append(Difference(key, step, x, y, relative, bound))
        else:
            found.largest = max(found.largest, relative)
