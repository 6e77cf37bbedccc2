"""Tolerances: how far a recorded value may move and still count as the same, per key pattern,
for the first resumed step and for the steps after it.

Profiles (the numbers of NeMo-Automodel's checkpoint-robustness oracle, `atol + rtol * |x|`):

| profile | first resumed step | later steps |
| --- | --- | --- |
| `exact` (default) | bit for bit | bit for bit |
| `strict` | 1e-6 abs | 1e-6 abs |
| `standard` | 1e-5 abs + 2e-3 rel | 5e-3 abs + 2e-3 rel |
| `relaxed` | 1e-4 abs + 7.5e-3 rel | 1e-2 abs + 7.5e-3 rel |

Only numbers move: integers, booleans, strings, RNG states, sample ids and the resume point
stay exact under every tolerance; watched tensors are compared through their statistics.
`(rtol, atol)` or `{"pattern": (rtol, atol)}` give a custom tolerance, the same at every step.

Also what else a comparison lets pass, and says it did: audited items the author excluded
(`ignore=`, `track(..., ignore=True)`), and latent streams (a random stream that differs but
that nothing draws from in the compared steps: a warning, unless `--resume-equiv-strict-latent`).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from ..rank.layout import RNG, is_audit_key, section_of

ToleranceRule = tuple[str, float, float]
"""(key pattern, rtol, atol); the first matching pattern applies."""


def tolerance_for(key: str, rules: Sequence[ToleranceRule]) -> Optional[tuple[float, float]]:
    for pattern, rtol, atol in rules:
        if fnmatch.fnmatchcase(key, pattern):
            return rtol, atol
    return None


def close(a: float, b: float, tol: Optional[tuple[float, float]]) -> bool:
    if tol is None or math.isnan(a) or math.isnan(b):
        return False
    rtol, atol = tol
    return abs(a - b) <= atol + rtol * abs(a)


def ignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether an audited key (`rng:generator eval.py:3 #0`) or a field inside one
    (`watch:loader.state.dataset_state`) matches an `ignore=` pattern."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def without_ignored(key: str, value: Any, patterns: Sequence[str]) -> tuple[Any, list[str]]:
    """`value` with the fields that match a pattern taken out, and their paths."""
    if not patterns or not isinstance(value, dict) or not is_audit_key(key):
        return value, []
    kept, dropped = {}, []
    for name, item in value.items():
        path = f"{key}.{name}"
        if ignored(path, patterns):
            dropped.append(path)
        else:
            inner, more = without_ignored(path, item, patterns)
            kept[name] = inner
            dropped += more
    return kept, dropped


def latent(
    key: str, base: dict[int, dict[str, Any]], res: dict[int, dict[str, Any]], split: int
) -> bool:
    """A random stream that no step after the split draws from, in either run: its state at
    the split carries to the end unchanged, so a difference in it changes nothing compared."""
    if section_of(key) != RNG:
        return False
    after = [s for s in base if s >= split]
    return (
        len({_text(base[s].get(key)) for s in after}) <= 1
        and len({_text(values.get(key)) for s, values in res.items() if s > split}) <= 1
    )


def _text(value: Any) -> str:
    return repr(value)


ToleranceRules = tuple[ToleranceRule, ...]


@dataclass(frozen=True)
class Tolerance:
    name: str
    """A profile's name, or "custom"."""
    first: ToleranceRules = ()
    """At the first resumed step."""
    later: ToleranceRules = ()
    """At every step after it."""

    @property
    def exact(self) -> bool:
        return not self.first and not self.later

    def at(self, step: int, split: int) -> ToleranceRules:
        return self.first if step == split + 1 else self.later

    def for_key(self, key: str, step: int, split: int) -> Optional[tuple[float, float]]:
        """(rtol, atol) of `key` at `step`, or None (exact)."""
        return tolerance_for(key, self.at(step, split))

    def describe(self) -> str:
        """In words, for reports."""
        if self.exact:
            return "exact"
        first, later = _words(self.first), _words(self.later)
        where = first if first == later else f"first resumed step {first}, later {later}"
        return f"{self.name} ({where})"


def _words(rules: ToleranceRules) -> str:
    parts = []
    for pattern, rtol, atol in rules:
        amount = " + ".join(
            text
            for text in (f"{atol:g} abs" if atol else "", f"{rtol:g} rel" if rtol else "")
            if text
        )
        parts.append((f"{pattern}: " if pattern != "*" else "") + (amount or "0"))
    return ", ".join(parts)


def _every(rtol: float, atol: float) -> ToleranceRules:
    return (("*", rtol, atol),)


PROFILES = {
    "exact": Tolerance("exact"),
    "strict": Tolerance("strict", _every(0.0, 1e-6), _every(0.0, 1e-6)),
    "standard": Tolerance("standard", _every(2e-3, 1e-5), _every(2e-3, 5e-3)),
    "relaxed": Tolerance("relaxed", _every(7.5e-3, 1e-4), _every(7.5e-3, 1e-2)),
}

WHY = (
    f"expected a profile ({', '.join(map(repr, PROFILES))}), (rtol, atol) for every key, or a "
    'dict of key patterns to (rtol, atol), e.g. {"loss": (1e-6, 0.0), "param*": (1e-5, 1e-8)}'
)


def _pair(pair: Any) -> Optional[tuple[float, float]]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        return None
    if not all(
        not isinstance(x, bool) and isinstance(x, (int, float)) and x >= 0 and not math.isinf(x)
        for x in pair
    ):
        return None
    return float(pair[0]), float(pair[1])


def parse_tolerance(value: Any) -> Tolerance:
    """A profile name, (rtol, atol), or {pattern: (rtol, atol)}; ValueError says what is
    expected."""
    if isinstance(value, str):
        found = PROFILES.get(value.strip().lower())
        if found is None:
            raise ValueError(f"unknown tolerance profile {value!r}; {WHY}")
        return found
    items = value.items() if isinstance(value, Mapping) else [("*", value)]
    rules = []
    for pattern, pair in items:
        parsed = _pair(pair)
        if not isinstance(pattern, str) or parsed is None:
            raise ValueError(f"rtol and atol must be finite numbers >= 0; {WHY}")
        rules.append((pattern, *parsed))
    return Tolerance("custom", tuple(rules), tuple(rules))


def parse_tolerance_option(raw: Any) -> Tolerance:
    """The option's text: a profile name, or `RTOL,ATOL` for every key."""
    text = str(raw).strip()
    if "," in text:
        try:
            rtol, atol = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"expected a profile name or RTOL,ATOL; {WHY}") from None
        return parse_tolerance((rtol, atol))
    return parse_tolerance(text)


@dataclass(frozen=True)
class ComparisonRules:
    """What shapes every comparison of one test."""

    steps: int
    tolerance: Tolerance = PROFILES["exact"]
    ignore: tuple[str, ...] = ()
    """`ignore=` patterns of audited keys or fields (beside what a trainer's own
    `track(..., ignore=True)` writes into its signature)."""
    strict_latent: bool = False

    def overridden(
        self,
        tolerance: Optional[Sequence[ToleranceRule]] = None,
        ignore: Optional[Sequence[str]] = None,
    ) -> ComparisonRules:
        """These rules with some replaced (the offline `compare`'s flags)."""
        given = self.tolerance
        if tolerance is not None:
            given = Tolerance("custom", tuple(tolerance), tuple(tolerance))
        return replace(
            self, tolerance=given, ignore=self.ignore if ignore is None else tuple(ignore)
        )
