"""Pure comparison of an uninterrupted run with a resumed one: data in, data out, no I/O.

The resumed launch must record exactly the steps after the split, on every rank, with the
same values the uninterrupted launch recorded at those steps. Step-numbering problems
(re-executed, missing, shifted, duplicated steps) are reported on their own, because a value
diff between step 1 of one run and step 4 of the other would only confuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..rank.encode import decode_float
from ..rank.layout import (
    AUTO,
    FLOAT_TAG,
    RNG,
    TENSOR_TAG,
    is_audit_key,
    is_training_value,
    section_of,
)
from ..signature import Signature, readable
from .accounting import is_identity_key
from .facts import Fact
from .noise import size_words
from .step_problems import StepProblem, step_problems
from .tolerance import (
    Tolerance,
    ToleranceRule,
    close,
    ignored,
    latent,
    tolerance_for,
    without_ignored,
)


@dataclass(frozen=True)
class Divergence:
    step: int
    rank: int
    key: str
    """Top-level recorded key."""
    path: str
    """Where inside the value it differs: the key itself, or e.g. `stats['lr'][1]`."""
    expected: Any
    actual: Any
    detail: str
    node: str = ""
    """The resumed rank's node, when the launcher names nodes (Slurm)."""


@dataclass
class Comparison:
    split: int
    steps: int
    world_size: int
    problems: list[StepProblem] = field(default_factory=list)
    divergence: Optional[Divergence] = None
    divergent_keys: dict[int, list[str]] = field(default_factory=dict)
    """Per rank, the keys that differ at the first divergent step (all ranks, same step)."""
    compared_steps: int = 0
    context: list[tuple[int, Any, Any]] = field(default_factory=list)
    """(step, uninterrupted value, resumed value) of the divergent key on its rank, around
    the first divergent step, for a report with limited context."""
    latent: list[str] = field(default_factory=list)
    """"rank R: rng:..." streams that differ but that no compared step draws from: let pass,
    and warned about (unless strict)."""
    ignored: list[str] = field(default_factory=list)
    """Audited keys and fields left out because an `ignore=` pattern names them."""
    facts: list[Fact] = field(default_factory=list)
    """What the comparator established besides the first divergence (a topology's
    envelopes and data accounting)."""
    how: str = ""
    """How the comparator compared, in words, when not bit for bit."""
    one_sided: list[str] = field(default_factory=list)
    """"auto:... (rank R: the <run> run only)": automatic keys one run recorded and the other
    recorded at no compared step (its recorder saw no such input): never a divergence."""

    @property
    def equal(self) -> bool:
        return not self.problems and self.divergence is None


def causal_order(key: str) -> tuple[bool, bool, str]:
    """The user's keys before the audit's, sample identities first among them."""
    return (is_audit_key(key), not is_identity_key(key), key)


def _numbers(values: Any) -> list[float]:
    # Statistics store NaN and infinities as their repr ("nan", "-inf"); float() reads both.
    return [float(v) for v in values]


def value_difference(
    a: Any, b: Any, path: str, tol: Optional[tuple[float, float]]
) -> Optional[tuple[str, Any, Any, str]]:
    """First difference between two encoded values: (path, a part, b part, why), or None.
    Under a tolerance `tol` floats and float tensors may move; a watched tensor's
    fingerprint (`{"hash": ..., "norm": ...}`) is then compared by its statistics."""
    if isinstance(a, dict) and isinstance(b, dict):
        if FLOAT_TAG in a and FLOAT_TAG in b:
            if a[FLOAT_TAG] == b[FLOAT_TAG] or close(decode_float(a), decode_float(b), tol):
                return None
            return path, a, b, "float differs"
        if TENSOR_TAG in a and TENSOR_TAG in b:
            return _tensor_difference(a[TENSOR_TAG], b[TENSOR_TAG], path, tol)
        if (FLOAT_TAG in a) != (FLOAT_TAG in b) or (TENSOR_TAG in a) != (TENSOR_TAG in b):
            return path, a, b, "type differs"
        if "hash" in a and "hash" in b and len(a) > 1:
            if tol is not None:
                return _fingerprint_difference(a, b, path, tol)
            if a["hash"] != b["hash"]:  # the whole fingerprint: its statistics say how much
                return path, a, b, "contents differ"
        for key in sorted(set(a) | set(b)):
            sub = f"{path}[{key!r}]"
            if key not in a or key not in b:
                return sub, a.get(key), b.get(key), "recorded by one run only"
            found = value_difference(a[key], b[key], sub, tol)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return path, a, b, f"length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = value_difference(x, y, f"{path}[{i}]", tol)
            if found:
                return found
        return None
    if type(a) is not type(b) or a != b:
        return path, a, b, "value differs"
    return None


EXACT_DTYPES = ("int", "uint", "bool")
"""Tensors of these dtypes hold counts and identities: exact under every tolerance."""


def _fingerprint_difference(a: dict, b: dict, path: str, tol: tuple[float, float]):
    """A watched tensor's fingerprint under a tolerance: equal hashes, or every statistic
    (norm, mean, absmax...) within it; one without statistics stays exact."""
    if a["hash"] == b["hash"]:
        return None
    stats = sorted((set(a) & set(b)) - {"hash"})
    if not stats:
        return path, a, b, "contents differ (no statistics to compare within the tolerance)"
    for name in stats:
        found = value_difference(a[name], b[name], f"{path}[{name!r}]", tol)
        if found:
            return path, a, b, f"contents differ ({name} beyond the tolerance)"
    return None


def _tensor_difference(a: dict, b: dict, path: str, tol: Optional[tuple[float, float]]):
    tagged_a, tagged_b = {TENSOR_TAG: a}, {TENSOR_TAG: b}
    if a.get("dtype") != b.get("dtype"):
        return path, tagged_a, tagged_b, "dtype differs"
    if a.get("shape") != b.get("shape"):
        return path, tagged_a, tagged_b, "shape differs"
    if a.get("hash") == b.get("hash"):
        return None
    if tol is not None and not str(a.get("dtype", "")).startswith(EXACT_DTYPES):
        # With a tolerance, small tensors compare element-wise; larger ones by their
        # statistics (the exact contents are not kept, only their fingerprint).
        if "values" in a and "values" in b:
            xs, ys = _numbers(a["values"]), _numbers(b["values"])
        else:
            keys = sorted(set(a.get("stats", {})) & set(b.get("stats", {})))
            xs = _numbers(a["stats"][k] for k in keys)
            ys = _numbers(b["stats"][k] for k in keys)
        if all(x == y or close(x, y, tol) for x, y in zip(xs, ys)):
            return None
    return path, tagged_a, tagged_b, "contents differ"


Allowance = Callable[[int, str, int], Optional[tuple[float, float]]]
"""(rank, key, step) -> (rtol, atol) that key may move by there, or None: exact."""


def allowance_of(tolerance: Union[Sequence[ToleranceRule], Tolerance, Allowance], split: int):
    """Key patterns (every step), a tolerance profile (its first step apart) or an allowance
    function, as an allowance; sample identities and audited streams are exact regardless."""
    if callable(tolerance):
        given: Allowance = tolerance
    elif isinstance(tolerance, Tolerance):
        profile = tolerance

        def given(rank: int, key: str, step: int) -> Optional[tuple[float, float]]:
            return profile.for_key(key, step, split)
    else:
        rules = tuple(tolerance)

        def given(rank: int, key: str, step: int) -> Optional[tuple[float, float]]:
            return tolerance_for(key, rules)

    def allowance(rank: int, key: str, step: int) -> Optional[tuple[float, float]]:
        if is_identity_key(key) or section_of(key) == RNG:
            return None
        return given(rank, key, step)

    return allowance


@dataclass(frozen=True)
class _DiffOptions:
    """How one comparison compares: tolerances, ignored items, latent streams."""

    allowance: Allowance
    user_only: bool = False
    ignore: Sequence[str] = ()
    strict_latent: bool = False


def _differences(
    step: int,
    rank: int,
    a: dict[str, Any],
    b: dict[str, Any],
    rules: _DiffOptions,
    result: Comparison,
) -> list[Divergence]:
    """Every key that differs between one rank's records `a` and `b` of one step, in causal
    order: they are what the report shows; the audit explains them."""
    keys = set(a) | set(b)
    if rules.user_only:
        keys = {k for k in keys if is_training_value(k)}
    found = []
    for key in sorted(keys, key=causal_order):
        if is_audit_key(key) and ignored(key, rules.ignore):
            _note(result.ignored, key)
            continue
        found += _difference(step, rank, key, a, b, rules, result)
    return found


def _difference(
    step: int, rank: int, key: str, a: dict, b: dict, rules: _DiffOptions, result: Comparison
) -> list[Divergence]:
    if key not in a or key not in b:
        run = "uninterrupted" if key in a else "resumed"
        return [
            Divergence(
                step, rank, key, key, a.get(key), b.get(key), f"recorded by the {run} run only"
            )
        ]
    x, dropped_a = without_ignored(key, a[key], rules.ignore)
    y, dropped_b = without_ignored(key, b[key], rules.ignore)
    for path in dropped_a + dropped_b:
        _note(result.ignored, path)
    diff = value_difference(x, y, key, rules.allowance(rank, key, step))
    if diff is None:
        return []
    path, x, y, why = diff
    return [Divergence(step, rank, key, path, x, y, why)]


def _note(seen: list[str], item: str) -> None:
    if item not in seen:
        seen.append(item)


def _without_latent(
    found: list[Divergence],
    rank: int,
    base: dict[int, dict[int, dict[str, Any]]],
    res: dict[int, dict[int, dict[str, Any]]],
    split: int,
    rules: _DiffOptions,
    result: Comparison,
) -> list[Divergence]:
    """Random streams nothing draws from after the split pass (noted), unless strict; the
    rest of the differences stand."""
    if rules.strict_latent or rules.user_only:
        return found
    kept = []
    for d in found:
        if latent(d.key, base[rank], res[rank], split):
            _note(result.latent, f"rank {rank}: {d.key}")
        else:
            kept.append(d)
    return kept


def _without_one_sided(
    found: list[Divergence],
    rank: int,
    base: dict[int, dict[int, dict[str, Any]]],
    res: dict[int, dict[int, dict[str, Any]]],
    first_step: int,
    result: Comparison,
) -> list[Divergence]:
    """An automatic key one run recorded where the other recorded it at no compared step:
    that run never had the chance (no DataLoader batch, no input it could read), so it is
    noted, never a divergence."""
    kept = []
    runs = (base[rank], res[rank])
    for d in found:
        if section_of(d.key) != AUTO:  # only automatic keys: the scan below is for them
            kept.append(d)
            continue
        never = [
            not any(d.key in values for s, values in steps.items() if s >= first_step)
            for steps in runs
        ]
        if any(never):
            run = "resumed" if never[0] else "uninterrupted"
            _note(result.one_sided, f"{d.key} (rank {rank}: the {run} run only)")
        else:
            kept.append(d)
    return kept


def compare_runs(
    uninterrupted: dict[int, Signature],
    resumed: dict[int, Signature],
    split: int,
    steps: int,
    tolerance: Union[Sequence[ToleranceRule], Tolerance, Allowance] = (),
    user_only: bool = False,
    skip_steps: int = 0,
    ignore: Sequence[str] = (),
    strict_latent: bool = False,
) -> Comparison:
    """Compare every rank of a resumed launch with the uninterrupted launch.

    `tolerance`: how far numbers may move (`allowance_of`; exact by default). `user_only` ignores the automatic audit keys and `skip_steps` the first resumed steps:
    the teeth check compares only what the user recorded after its mutation. `ignore`:
    patterns of audited keys or fields left out; a latent stream (nothing draws from it in
    the compared steps) passes with a note in `latent`, unless `strict_latent`.
    """
    rules = _DiffOptions(allowance_of(tolerance, split), user_only, ignore, strict_latent)
    world_size = max(len(uninterrupted), len(resumed))
    result = Comparison(split=split, steps=steps, world_size=world_size)
    for rank in range(world_size):
        if rank not in uninterrupted or rank not in resumed:
            which = "uninterrupted" if rank not in uninterrupted else "resumed"
            result.problems.append(
                StepProblem(
                    "missing-rank", rank, (), f"rank {rank}: the {which} run has no signature"
                )
            )
            continue
        result.problems.extend(
            step_problems(rank, uninterrupted[rank], resumed[rank], split, steps)
        )
    if result.problems:
        return result

    base_steps = {rank: sig.by_step() for rank, sig in uninterrupted.items()}
    res_steps = {rank: sig.by_step() for rank, sig in resumed.items()}
    first_step = split + 1 + skip_steps
    for step in range(first_step, steps + 1):
        result.compared_steps += 1
        found: list[Divergence] = []
        for rank in range(world_size):
            a, b = base_steps[rank][step], res_steps[rank][step]
            here = _differences(step, rank, a, b, rules, result)
            here = _without_one_sided(here, rank, base_steps, res_steps, first_step, result)
            here = _without_latent(here, rank, base_steps, res_steps, split, rules, result)
            if here:
                result.divergent_keys[rank] = [d.key for d in here]
                found += here
        if found:
            # Shown first: a key the user recorded (a sample identity first, lowest rank),
            # else an audit key; the audit explains, the user's values are what they know.
            first = min(found, key=lambda d: (causal_order(d.key)[:2], d.rank, d.key))
            node = str(resumed[first.rank].header.get("node") or "")
            result.divergence = dataclasses.replace(first, node=node)
            break
    div = result.divergence
    if div is not None:
        for step in range(max(first_step, div.step - 1), min(steps, div.step + 2) + 1):
            a, b = base_steps[div.rank][step], res_steps[div.rank][step]
            result.context.append((step, a.get(div.key), b.get(div.key)))
    return result


def first_difference(cmp: Comparison) -> str:
    """Where a comparison first differs, in a few words."""
    div = cmp.divergence
    if div is not None:
        return f"step {div.step}, rank {div.rank}, {div.key!r}"
    return cmp.problems[0].message if cmp.problems else ""


def format_comparison(
    cmp: Comparison, label: str = "", sides: tuple[str, str] = ("uninterrupted", "resumed")
) -> str:
    """The comparison in words; `sides`: how the reference and the judged run are named."""
    label = label or f"split {cmp.split}"
    width = max(map(len, sides))
    if cmp.problems:
        lines = [f"{label}: the {sides[1]} run did not record the steps it should have:"]
        lines += [f"  {p.message}" for p in cmp.problems]
        return "\n".join(lines)
    div = cmp.divergence
    if div is None:
        ranks = f"all {cmp.world_size} ranks" if cmp.world_size > 1 else "its one rank"
        return f"{label}: equal on {ranks} over {cmp.compared_steps} steps"
    where = f"key {div.key!r}" + (f" at {div.path}" if div.path != div.key else "")
    on = f" (node {div.node})" if div.node else ""
    lines = [
        f"{label}: first divergence at step {div.step}, rank {div.rank}{on}, {where}: {div.detail}",
        f"  [- {sides[0]}]{' ' * (width - len(sides[0]))} {readable(div.expected)}",
        f"  [+ {sides[1]}]{' ' * (width - len(sides[1]))} {readable(div.actual)}",
    ]
    size = size_words(div.expected, div.actual)
    if size:
        lines.append(f"  ({size})")
    if cmp.how:
        lines.append(f"  compared: {cmp.how}")
    if len(cmp.context) > 1:
        lines.append(f"  {div.key!r} on rank {div.rank} around step {div.step}:")
        for step, a, b in cmp.context:
            if a == b:
                lines.append(f"      step {step}   {readable(a)}")
            else:
                lines.append(f"    - step {step}   {readable(a)}")
                lines.append(f"    + step {step}   {readable(b)}")
    per_rank = "; ".join(
        f"rank {r}: {', '.join(keys)}" for r, keys in sorted(cmp.divergent_keys.items())
    )
    if per_rank:
        lines.append(f"  keys that differ at step {div.step}: {per_rank}")
    return "\n".join(lines)
