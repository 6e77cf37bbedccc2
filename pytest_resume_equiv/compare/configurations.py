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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.encode import decode_float
from . import facts
from .global_step import GlobalStep, Run, global_steps, samples_key
from .jsonable import NOT_IN_JSON
from .tolerance import Tolerance, close, ignored

FLOAT32_EPS = 2.0**-24
"""Float32's unit roundoff: what the records' floats (float32 tensors, statistics of them)
resolve."""
SHORT = "optimizer steps run"
"""The difference said when neither configuration recorded a step the marker asks for."""
NEAR_ZERO = 1e-3
"""A number below this fraction of the largest of its kind at its step (a parameter's norm
or largest magnitude, a buffer's, a gradient's) is judged on that scale: a tensor that only
round-off moves (a bias whose true gradient is zero, updated by the optimizer from noise)
has a large relative difference that is nothing."""
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
    bound_name: str = "round-off bound"

    def text(self) -> str:
        size = (
            f" (relative {self.relative:.2g}, {self.bound_name} {self.bound:.2g})"
            if self.relative is not None and self.bound is not None
            else ""
        )
        return (
            f"step {self.step}: {self.what}: baseline {_show(self.baseline)}, variant "
            f"{_show(self.variant)}{size}"
        )


def _show(value: Any) -> str:
    """A value as a report says it: floats to 9 digits, encoded floats (a learning rate's
    exact bits) by their value."""
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    number = decode_float(value)
    if number is not None:
        return repr(number)
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
    tolerance: str = "auto"
    """How numbers were judged: "auto" (the round-off bound) or the marker's tolerance."""
    ignored: list[str] = field(default_factory=list)
    """Quantities that differ and match an `ignore=` pattern: left out, said so."""
    ignore: list[str] = field(default_factory=list)
    """The `ignore=` patterns (the diagnosis reads no evidence they leave out)."""
    dropout: dict[str, int] = field(default_factory=dict)
    """Dropout calls over both runs: `drawn` (masks drawn: dropout kept), `off` (made an
    identity: dropout="off")."""
    baseline_steps: dict[int, GlobalStep] = field(
        default_factory=dict, compare=False, repr=False, metadata=NOT_IN_JSON
    )
    """Each run's steps as compared, with every rank's records (what the diagnosis reads:
    diagnose/at_configurations.py); in memory only."""
    variant_steps: dict[int, GlobalStep] = field(
        default_factory=dict, compare=False, repr=False, metadata=NOT_IN_JSON
    )

    @property
    def equal(self) -> bool:
        return not self.differences

    @property
    def short(self) -> bool:
        """Neither configuration ran the marker's steps: the test asks for more steps than
        the trainer trains (no difference between the configurations)."""
        return any(d.what == SHORT for d in self.differences)

    def steps_of(self, role: str) -> dict[int, GlobalStep]:
        return self.baseline_steps if role == "baseline" else self.variant_steps

    def lines(self, label: str) -> list[str]:
        head = f"{label}: {self.variant} against the baseline {self.baseline}"
        if self.equal:
            return [
                f"{head}: equal over {self.steps} steps (exactly: step counts, learning rates, "
                f"samples ({self.samples_key or 'none recorded'}); within "
                f"{'round-off' if self.tolerance == 'auto' else 'the tolerance'}: loss, "
                f"gradient, parameters; largest relative difference {self.largest:.2g})",
                *self.said(),
            ]
        shown = self.differences[:SHOWN]
        more = len(self.differences) - len(shown)
        tail = [f"  (and {more} more quantities differ)"] if more else []
        return [f"{head}: differs", *(f"  {d.text()}" for d in shown), *tail, *self.said()]

    def said(self) -> list[str]:
        """What the comparison let pass or changed, said where it did: a tolerance, ignored
        quantities, dropout."""
        said = []
        if self.short:
            said.append(
                "  neither configuration ran the steps the marker asks for: the trainer must "
                "train exactly steps= optimizer steps (pass {steps} to it), or set steps= to "
                "what it trains"
            )
        if self.tolerance != "auto":
            said.append(f"  tolerance: {self.tolerance} (the marker's, instead of round-off)")
        if self.ignored:
            said.append(f"  ignored (ignore=): {', '.join(self.ignored[:SHOWN])}")
        if self.dropout.get("off"):
            said.append(
                f"  dropout off: {self.dropout['off']} dropout calls made an identity in both "
                'runs (masks drawn per micro-batch cannot equal the big batch\'s; dropout="on" '
                "keeps them)"
            )
        if self.dropout.get("drawn"):
            said.append(f"  dropout on: {self.dropout['drawn']} dropout calls drew masks")
        return said

    def summary(self, label: str) -> list[str]:
        return []


def compare_configurations(
    baseline: Run,
    variant: Run,
    steps: int,
    names: tuple[str, str] = ("", ""),
    tolerance: Optional[Tolerance] = None,
    ignore: Sequence[str] = (),
) -> ConfigurationFacts:
    """Every optimizer step of both runs, over the global batch; numbers within `tolerance`
    (None: the round-off bound), the quantities that match an `ignore` pattern left out."""
    found = ConfigurationFacts(
        *names, tolerance=tolerance.describe() if tolerance else "auto", ignore=list(ignore)
    )
    found.samples_key = samples_key(baseline)
    a = found.baseline_steps = global_steps(baseline, found.samples_key)
    b = found.variant_steps = global_steps(variant, found.samples_key)
    for step in range(1, steps + 1):
        if step not in a and step not in b:  # the trainer stops before the marker's steps
            ran = (f"{max(a, default=0)} of {steps}", f"{max(b, default=0)} of {steps}")
            found.differences.append(Difference(SHORT, step, *ran))
            break
        if step not in a or step not in b:
            recorded = ("recorded" if step in a else "none", "recorded" if step in b else "none")
            found.differences.append(Difference("the step's records", step, *recorded))
            break
        found.steps = step
        _exact(found, step, a[step], b[step])
        _round_off(found, step, a[step], b[step], tolerance)
    if not any(a[s].samples or a[s].numbers or a[s].exact for s in a):
        found.differences.append(
            Difference("nothing recorded to compare", 1, "no samples, loss or parameters", "")
        )
    firsts: dict[str, Difference] = {}
    for difference in found.differences:  # one line per quantity: its first difference
        if ignored(difference.what, ignore):
            found.ignored.append(difference.what)
        else:
            firsts.setdefault(difference.what, difference)
    found.ignored = sorted(set(found.ignored))
    found.differences = list(firsts.values())
    ranks = [r for run in (a, b) for g in run.values() for r in g.ranks.values()]
    drawn, off = sum(r.dropout for r in ranks), sum(r.dropout_off for r in ranks)
    found.dropout = {k: v for k, v in (("drawn", drawn), ("off", off)) if v}
    return found


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


FIRST = ("loss", "gradient")
"""The numbers a report lists first at a step: what the step computed, then what it changed."""


def _in_order(key: str) -> tuple[int, str]:
    return (FIRST.index(key) if key in FIRST else len(FIRST), key)


def _kind(key: str) -> str:
    """What a number is, whichever tensor: `model.params[...].norm`, `gradient[...]`."""
    if "[" not in key:
        return key
    return key[: key.index("[")] + "[]" + key[key.rindex("]") + 1 :]


def _round_off(
    found: ConfigurationFacts,
    step: int,
    a: GlobalStep,
    b: GlobalStep,
    tolerance: Optional[Tolerance],
) -> None:
    """Numbers within `bound` relative: FLOAT32_EPS x the global batch x the steps taken, or
    within the marker's `tolerance` where it gives one."""
    bound = FLOAT32_EPS * max(a.batch, 1) * step
    keys = sorted(set(a.numbers) & set(b.numbers), key=_in_order)
    largest: dict[str, float] = {}
    for key in keys:
        kind = _kind(key)
        largest[kind] = max(largest.get(kind, 0.0), abs(a.numbers[key]), abs(b.numbers[key]))
    for key in keys:
        x, y = a.numbers[key], b.numbers[key]
        scale = max(abs(x), abs(y), NEAR_ZERO * largest[_kind(key)])
        relative = abs(x - y) / scale if scale > 0 else 0.0
        if tolerance is not None:
            pair = tolerance.for_key(key, step, 0)
            within = x == y or close(y, x, pair)
            bound = pair[0] if pair else 0.0
        else:
            within = math.isfinite(relative) and relative <= bound
        if not within:
            name = "round-off bound" if tolerance is None else "tolerance rtol"
            found.differences.append(Difference(key, step, x, y, relative, bound, name))
        else:
            found.largest = max(found.largest, relative)
