"""The `@equivalent(...)` marker: the same training under another batching or parallelism.
A baseline configuration and named variants, each a dict of `nproc`, `nnodes`, `args`
(appended to the command) and `env` (merged); each variant is one pytest item compared with
the baseline. Validated like the resume marker: a message naming the keyword, the value and
what is expected, and only the marked test fails."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, Optional

from .compare.tolerance import Tolerance, parse_tolerance
from .errors import SettingError
from .marker import KEYWORDS, Configuration, Configurations, MarkerSpec, _int

MARKER = "equivalent"
MARKER_DOC = (
    "equivalent(steps, baseline=None, variants, nproc=2, nnodes=1, timeout=None, "
    'tolerance="auto", env=None, ignore=None, auto=True, dropout="off"): '
    "run the test's training as the "
    "baseline configuration and as each named variant (dicts of nproc, nnodes, args, env), "
    "one test item per variant, and compare every optimizer step over the global batch"
)
SHARED = ("nproc", "nnodes", "timeout", "env", "ignore")
"""The resume marker's keywords an equivalence test takes, with the same meaning (`ignore`:
patterns of the compared quantities to leave out, said so in the report)."""
KEYS = ("nproc", "nnodes", "args", "env")
"""What a configuration (the baseline, a variant) may set."""
MARKER_KEYWORDS = ("steps", "baseline", "variants", *SHARED, "tolerance", "auto", "dropout")
DROPOUT = ("off", "on")
"""`dropout=`: off (the default) makes every dropout an identity in both launches, as masks
drawn per micro-batch cannot equal the big batch's; on keeps them."""


def _error(keyword: str, value: Any, why: str) -> SettingError:
    return SettingError(f"@equivalent: invalid {keyword}={value!r}: {why}")


def _configuration(keyword: str, raw: Any, nproc: int, nnodes: int) -> Configuration:
    if raw is None:
        return Configuration(nproc, nnodes)
    if not isinstance(raw, Mapping):
        raise _error(keyword, raw, f"expected a dict of {', '.join(KEYS)}")
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise _error(keyword, raw, f"unknown key {unknown[0]!r}; a configuration sets {KEYS}")
    args = raw.get("args", ())
    args = [args] if isinstance(args, str) else args
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise _error(keyword, raw, 'args must be a list of str, e.g. ["--accum", "4"]')
    try:
        env = KEYWORDS["env"](raw.get("env"))
        world = (
            _int("nproc", 1)(raw.get("nproc", nproc)),
            _int("nnodes", 1)(raw.get("nnodes", nnodes)),
        )
    except SettingError as exc:
        raise _error(keyword, raw, str(exc).split(": ", 2)[-1]) from None
    return Configuration(*world, tuple(args), env)


def _tolerance(kwargs: Mapping[str, Any]) -> Optional[Tolerance]:
    """None for "auto" (the default: round-off bounded from the runs), else a tolerance as
    the resume marker's (a profile, (rtol, atol), or {pattern: (rtol, atol)})."""
    value = kwargs.get("tolerance", "auto")
    if value == "auto":
        return None
    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise _error("tolerance", value, f'"auto" (the default), or {exc}') from None


def variant_names(kwargs: Mapping[str, Any]) -> list[str]:
    """The variants' names, the items' ids, in the marker's order ([] when `variants` is no
    dict: the one item then fails with the marker's error)."""
    variants = kwargs.get("variants")
    return [str(k) for k in variants] if isinstance(variants, Mapping) else []


def parse_equivalent(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], variant: Optional[str]
) -> MarkerSpec:
    """Validate the marker's arguments for the item of `variant`; raises SettingError naming
    the keyword and value."""
    if args:
        raise SettingError(
            "@equivalent takes keywords only, e.g. @equivalent(steps=6, variants={...})"
        )
    unknown = [k for k in kwargs if k not in MARKER_KEYWORDS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], MARKER_KEYWORDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingError(
            f"@equivalent: unknown keyword {unknown[0]!r}{hint}; valid keywords: "
            + ", ".join(MARKER_KEYWORDS)
        )
    for required in ("steps", "variants"):
        if required not in kwargs:
            raise SettingError(
                f"@equivalent needs {required}=..., e.g. @equivalent(steps=6, "
                'variants={"dp2": dict(nproc=2)})'
            )
    try:
        values = {k: KEYWORDS[k](kwargs[k]) for k in SHARED if k in kwargs}
        steps = _int("steps", 1)(kwargs["steps"])
    except SettingError as exc:
        raise SettingError(str(exc).replace("@resume_equivalent", "@equivalent", 1)) from None
    spec = MarkerSpec(steps=steps, splits=(), tolerance=_tolerance(kwargs), **values)
    if kwargs.get("auto", True) is not True:
        raise _error(
            "auto",
            kwargs["auto"],
            "an equivalence test reads what automatic recording sees (every optimizer step, "
            "its gradients, its samples): only True is taken",
        )
    variants = kwargs["variants"]
    if not isinstance(variants, Mapping) or not variants:
        raise _error("variants", variants, 'expected a non-empty dict, e.g. {"dp2": dict(nproc=2)}')
    baseline = _configuration("baseline", kwargs.get("baseline"), spec.nproc, spec.nnodes)
    if variant not in variants:  # a test that takes no resume_equiv fixture has no items
        raise SettingError(
            "@equivalent makes one item per variant through the resume_equiv fixture: "
            "take it (def test_x(resume_equiv)) and call resume_equiv.run(...)"
        )
    found = _configuration(f"variants[{variant!r}]", variants[variant], spec.nproc, spec.nnodes)
    if found == baseline:
        raise _error(
            f"variants[{variant!r}]", variants[variant], "equals the baseline: nothing to compare"
        )
    dropout = kwargs.get("dropout", "off")
    if dropout not in DROPOUT:
        raise _error("dropout", dropout, 'expected "off" (the default) or "on"')
    chosen = Configurations(baseline, variant, found, dropout)
    return dataclasses.replace(spec, configurations=chosen)
