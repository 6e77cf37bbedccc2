"""Noise measured, not guessed: how far runs that should be the same (the uninterrupted run
and its determinism controls, or two resumed processes from one checkpoint) drift apart,
per rank, key and step, and how big a difference is in words.

Only numbers can drift: a value whose other parts (integers, strings, RNG states, sample
ids, a tensor's dtype and shape) differ between such runs cannot be judged within any noise;
it is listed as `unjudgeable`. The spread of a key at a step is the largest deviation of its
numbers so far (a running maximum), so one step where two noisy runs happen to round alike
does not shrink what the next may do.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.encode import decode_float
from ..rank.layout import FLOAT_TAG, TENSOR_TAG
from ..signature import Signature
from . import facts

Run = dict[int, Signature]

ROUNDING = 1e-3
"""Relative difference up to which a number 'differs at rounding level' (a reduction in
another order, TF32, bf16 accumulation); beyond it, it 'differs materially'."""
TOO_WIDE = 0.1
"""Relative spread beyond which a measured noise is too wide to judge a value against."""


def split_value(value: Any) -> tuple[list[float], Any]:
    """(the numbers an encoded value holds, the rest of it): a float's exact value, a
    tensor's values (or statistics, when it is large), a fingerprint's statistics; the rest
    keeps what must be equal exactly (dtype, shape, ints, strings; hashes are left out where
    statistics stand for the contents)."""
    numbers: list[float] = []

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if FLOAT_TAG in v:
                numbers.append(float(decode_float(v) or 0.0))
                return FLOAT_TAG
            if TENSOR_TAG in v:
                t = v[TENSOR_TAG]
                found = t.get("values", list(t.get("stats", {}).values()))
                numbers.extend(float(x) for x in found)
                return (t.get("dtype"), tuple(t.get("shape", ())), len(found))
            stats = "hash" in v and len(v) > 1
            return tuple((k, walk(x)) for k, x in sorted(v.items()) if not (stats and k == "hash"))
        if isinstance(v, list):
            return tuple(walk(x) for x in v)
        if isinstance(v, float):
            numbers.append(v)
            return float
        return v

    rest = walk(value)
    return numbers, rest


def deviation(a: Any, b: Any) -> Optional[float]:
    """The largest absolute difference between the numbers of two encoded values, or None
    when they differ in anything that is not a number."""
    xs, rest_a = split_value(a)
    ys, rest_b = split_value(b)
    if rest_a != rest_b or len(xs) != len(ys):
        return None
    worst = 0.0
    for x, y in zip(xs, ys):
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        worst = max(worst, abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf)
    return worst


def magnitude(value: Any) -> float:
    xs, _ = split_value(value)
    finite = [abs(x) for x in xs if math.isfinite(x)]
    return max(finite, default=0.0)


def ulps(a: float, b: float) -> int:
    """How many representable float64 values lie between `a` and `b`."""

    def ordered(x: float) -> int:
        bits = struct.unpack(">q", struct.pack(">d", x))[0]
        return bits if bits >= 0 else -(bits & 0x7FFFFFFFFFFFFFFF)

    return abs(ordered(a) - ordered(b))


def size_words(a: Any, b: Any) -> str:
    """How big the difference between two encoded values is, in words: the relative
    difference, for floats the distance in ulps, and whether that is rounding level."""
    dev = deviation(a, b)
    if dev is None or not math.isfinite(dev):
        return ""
    if dev == 0:
        return "equal statistics: the contents differ below what they resolve"
    scale = max(magnitude(a), magnitude(b))
    rel = dev / scale if scale else math.inf
    parts = [f"relative {rel:.2g}"]
    x, y = decode_float(a), decode_float(b)
    if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
        parts.append(f"{ulps(x, y)} ulps")
    level = "rounding level" if rel <= ROUNDING else "materially"
    return ", ".join(parts) + f": differs {'at ' if rel <= ROUNDING else ''}{level}"


def relative_gap(a: Any, b: Any) -> Optional[float]:
    """The largest difference between the numbers of two encoded values relative to their
    size (0 where they differ only below what their numbers resolve, a hash); None when they
    differ in anything that is not a number."""
    dev = deviation(a, b)
    if dev is None:
        return None
    scale = max(magnitude(a), magnitude(b))
    return 0.0 if dev == 0 else dev / scale if scale > 0 else math.inf


def rounding_level(a: Any, b: Any) -> bool:
    dev = deviation(a, b)
    if dev is None:
        return False
    scale = max(magnitude(a), magnitude(b))
    return dev == 0 or (scale > 0 and dev / scale <= ROUNDING)


@facts.fact("noise")
@dataclass
class NoiseFacts:
    """The measured spread between runs that should be the same."""

    source: str
    """"uninterrupted" (the run and its controls) or "resumed" (two resumed processes)."""
    runs: list[str] = field(default_factory=list)
    """Their run directories."""
    first_step: int = 1
    spread: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """rank -> key -> step -> the largest deviation of the key's numbers up to that step."""
    relative: dict[str, float] = field(default_factory=dict)
    """key -> its largest spread relative to its magnitude, over ranks and steps."""
    unjudgeable: list[str] = field(default_factory=list)
    """"step S, rank R, key K": differences no noise can account for (not numbers)."""

    @property
    def noisy(self) -> bool:
        return any(v for keys in self.spread.values() for s in keys.values() for v in s.values())

    def moves(self, key: str) -> bool:
        """Whether the noise moves `key` at all (on some rank, at some step)."""
        return self.relative.get(key, 0.0) > 0 or any(key in keys for keys in self.spread.values())

    def at(self, rank: int, key: str, step: int) -> float:
        return self.spread.get(str(rank), {}).get(key, {}).get(str(step), 0.0)

    def too_wide(self, keys: list[str]) -> list[str]:
        """Those of `keys` whose noise is too wide to judge a value against."""
        return [k for k in keys if self.relative.get(k, 0.0) > TOO_WIDE]

    def describe(self) -> str:
        what = (
            "the uninterrupted run and its control"
            if self.source == "uninterrupted"
            else "two resumed processes from the same checkpoint"
        )
        if not self.noisy:
            return f"{what} are bitwise equal"
        worst = sorted(self.relative.items(), key=lambda kv: -kv[1])[:3]
        spread = ", ".join(f"{k} {v:.2g}" for k, v in worst)
        runs = f"{len(self.runs) + 1} runs"
        return f"{what} differ by noise ({runs}; largest relative spread: {spread})"

    def lines(self, label: str) -> list[str]:
        return [f"{label}: measured noise: {self.describe()}"]

    def summary(self, label: str) -> list[str]:
        return []


def scaled_to(noise: NoiseFacts, reference: Run, run: Run) -> NoiseFacts:
    """Noise between two resumed processes, scaled to how far `run` starts from `reference`.

    A fresh process that computes differently (another kernel) starts off by a rounding-level
    difference at the first resumed step; a repeat of it measures how such a difference grows.
    So each key's spread is scaled by how much larger the first difference from the
    uninterrupted run is than the two resumed processes' own, where that first difference is at
    rounding level (a material one is never scaled: it is no rounding)."""
    scaled = dataclasses.replace(noise, spread={}, relative=dict(noise.relative))
    for rank, keys in noise.spread.items():
        ours = reference.get(int(rank))
        theirs = run.get(int(rank))
        if ours is None or theirs is None:
            continue
        base, res = ours.by_step(), theirs.by_step()
        out: dict[str, dict[str, float]] = {}
        for key, steps in keys.items():
            first = min(steps, key=int)
            a, b = base.get(int(first), {}).get(key), res.get(int(first), {}).get(key)
            start = deviation(a, b) or 0.0
            factor = 1.0
            if rounding_level(a, b) and start > steps[first] > 0:
                factor = start / steps[first]
            out[key] = {step: value * factor for step, value in steps.items()}
            scaled.relative[key] = noise.relative.get(key, 0.0) * factor
        scaled.spread[rank] = out
    return scaled


def measure(
    reference: Run, others: list[Run], first_step: int, steps: int, source: str, dirs: list[str]
) -> NoiseFacts:
    """The spread between `reference` and each of `others`, per rank, key and step from
    `first_step` to `steps`."""
    noise = NoiseFacts(source, dirs, first_step)
    for rank, sig in sorted(reference.items()):
        base = sig.by_step()
        worst: dict[str, float] = {}
        per_key: dict[str, dict[str, float]] = {}
        for step in range(first_step, steps + 1):
            ours = base.get(step, {})
            for run in others:
                theirs = run[rank].by_step().get(step, {}) if rank in run else {}
                for key in sorted(set(ours) | set(theirs)):
                    dev = deviation(ours.get(key), theirs.get(key))
                    if dev is None:
                        noise.unjudgeable.append(f"step {step}, rank {rank}, key {key!r}")
                        continue
                    worst[key] = max(worst.get(key, 0.0), dev)
                    if worst[key]:
                        scale = magnitude(ours.get(key)) or 1.0
                        noise.relative[key] = max(noise.relative.get(key, 0.0), worst[key] / scale)
            for key, value in worst.items():
                if value:
                    per_key.setdefault(key, {})[str(step)] = value
        if per_key:
            noise.spread[str(rank)] = per_key
    noise.unjudgeable = list(dict.fromkeys(noise.unjudgeable))[:20]
    return noise
