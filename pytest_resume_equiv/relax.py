"""What a comparison lets pass, and says it did: numeric tolerances (`tolerance=`), audited
items the author excluded (`ignore=`, `track(..., ignore=True)`), and latent streams (a random
stream that differs but that nothing draws from in the compared steps: a warning, unless
`--resume-equiv-strict-latent`)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from typing import Any, Optional

from .rank.layout import RNG, is_audit_key, section_of

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
