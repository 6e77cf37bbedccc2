"""Pure comparison of an uninterrupted run with a resumed one: data in, data out, no I/O.

The resumed launch must record exactly the steps after the split, on every rank, with the
same values the uninterrupted launch recorded at those steps. Step-numbering problems
(re-executed, missing, shifted, duplicated steps) are reported on their own, because a value
diff between step 1 of one run and step 4 of the other would only confuse.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .rank.encode import decode_float
from .rank.layout import FLOAT_TAG, TENSOR_TAG
from .signature import Signature

ToleranceRule = tuple[str, float, float]
"""(key pattern, rtol, atol); the first matching pattern applies."""


@dataclass(frozen=True)
class StepProblem:
    kind: str
    rank: int
    steps: tuple[int, ...]
    message: str


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

    @property
    def equal(self) -> bool:
        return not self.problems and self.divergence is None


EARLY_STOP = (
    " (a data iterator saved exhausted at an epoch boundary, or a stop condition that counts "
    "from the resume?)"
)


def steps_text(steps: Sequence[int]) -> str:
    """'step 4' or 'steps 1-3, 5'."""
    return f"{'step' if len(set(steps)) == 1 else 'steps'} {step_ranges(steps)}"


def step_ranges(steps: Sequence[int]) -> str:
    """Compact step list: 1-3, 5, 7-8."""
    items = sorted(set(steps))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(parts)


def _order_problems(sig: Signature, run: str) -> list[StepProblem]:
    problems = []
    counts = Counter(step for step, _ in sig.steps)
    dupes = sorted(step for step, n in counts.items() if n > 1)
    if dupes:
        problems.append(
            StepProblem(
                "duplicate",
                sig.rank,
                tuple(dupes),
                f"rank {sig.rank}: the {run} run recorded {steps_text(dupes)} more than once "
                "(record() must be called once per step)",
            )
        )
    order = [s for s, _ in sig.steps]
    if any(b < a for a, b in zip(order, order[1:])):
        problems.append(
            StepProblem(
                "out-of-order",
                sig.rank,
                tuple(order),
                f"rank {sig.rank}: the {run} run recorded steps out of order ({', '.join(map(str, order[:12]))})",
            )
        )
    return problems


def _step_problems(
    rank: int, base: Signature, resumed: Signature, split: int, steps: int
) -> list[StepProblem]:
    problems = _order_problems(base, "uninterrupted") + _order_problems(resumed, "resumed")
    expected = set(range(split + 1, steps + 1))
    got = set(resumed.by_step())
    base_missing = sorted(expected - set(base.by_step()))
    if base_missing:
        problems.append(
            StepProblem(
                "uninterrupted-missing",
                rank,
                tuple(base_missing),
                f"rank {rank}: the uninterrupted run never recorded {steps_text(base_missing)} "
                f"(it must record every step 1-{steps})",
            )
        )
    if got != expected:
        whole = _whole_run_problem(rank, got, expected, split)
        problems += [whole] if whole else _resumed_step_problems(rank, got, split, steps)
    return problems


def _whole_run_problem(
    rank: int, got: set[int], expected: set[int], split: int
) -> Optional[StepProblem]:
    """A resumed run that recorded nothing, or every step under another number."""
    if not got:
        return StepProblem(
            "missing",
            rank,
            tuple(sorted(expected)),
            f"rank {rank}: the resumed run recorded no steps (expected {step_ranges(expected)}): "
            f"it stopped right after loading{EARLY_STOP}, or it never calls "
            "pytest_resume_equiv.record(step, ...) once a run is resumed",
        )
    shift = min(got) - (split + 1)
    if shift and got == {s + shift for s in expected}:
        return StepProblem(
            "shifted",
            rank,
            tuple(sorted(got)),
            f"rank {rank}: the resumed run's step numbers are shifted by {shift:+d}: it recorded "
            f"steps {step_ranges(got)} where the uninterrupted run recorded "
            f"{step_ranges(expected)} after the split at step {split}; the step counter was "
            f"saved or restored off by {abs(shift)}",
        )
    return None


def _resumed_step_problems(rank: int, got: set[int], split: int, steps: int) -> list[StepProblem]:
    """Steps the resumed run did again (at or before the split), skipped, or ran past the end."""
    problems = []
    replayed = sorted(s for s in got if s <= split)
    if replayed == [split]:
        problems.append(
            StepProblem(
                "re-executed",
                rank,
                (split,),
                f"rank {rank}: the resumed run re-executed step {split}, the step the checkpoint "
                "was saved after: the global step counter was saved or restored off by one",
            )
        )
    elif replayed:
        problems.append(
            StepProblem(
                "re-executed",
                rank,
                tuple(replayed),
                f"rank {rank}: the resumed run re-executed {steps_text(replayed)}, which the "
                f"checkpoint saved at step {split} had already done; the resume restarted "
                f"from step {min(replayed)} instead of continuing at step {split + 1} "
                "(step counter not restored?)",
            )
        )
    expected = set(range(split + 1, steps + 1))
    missing = sorted(expected - got)
    if missing:
        early = missing[-1] == steps and got < expected
        problems.append(
            StepProblem(
                "missing",
                rank,
                tuple(missing),
                f"rank {rank}: the resumed run never recorded {steps_text(missing)} "
                f"(expected every step {split + 1}-{steps})"
                + (f": it stopped early{EARLY_STOP}" if early else ""),
            )
        )
    extra = sorted(s for s in got if s > steps)
    if extra:
        problems.append(
            StepProblem(
                "extra",
                rank,
                tuple(extra),
                f"rank {rank}: the resumed run recorded {steps_text(extra)}, past steps={steps}",
            )
        )
    return problems


def is_audit_key(key: str) -> bool:
    """Keys the in-rank audit added (`rng:...`, `watch:...`), not the user's own."""
    return ":" in key


def _tolerance_for(key: str, rules: Sequence[ToleranceRule]) -> Optional[tuple[float, float]]:
    for pattern, rtol, atol in rules:
        if fnmatch.fnmatchcase(key, pattern):
            return rtol, atol
    return None


def _close(a: float, b: float, tol: Optional[tuple[float, float]]) -> bool:
    if tol is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return False
    rtol, atol = tol
    return abs(a - b) <= atol + rtol * abs(a)


def _numbers(values: Any) -> list[float]:
    # Statistics store NaN and infinities as their repr ("nan", "-inf"); float() reads both.
    return [float(v) for v in values]


def value_difference(
    a: Any, b: Any, path: str, tol: Optional[tuple[float, float]]
) -> Optional[tuple[str, Any, Any, str]]:
    """First difference between two encoded values: (path, a part, b part, why), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if FLOAT_TAG in a and FLOAT_TAG in b:
            if a[FLOAT_TAG] == b[FLOAT_TAG] or _close(decode_float(a), decode_float(b), tol):
                return None
            return path, a, b, "float differs"
        if TENSOR_TAG in a and TENSOR_TAG in b:
            return _tensor_difference(a[TENSOR_TAG], b[TENSOR_TAG], path, tol)
        if (FLOAT_TAG in a) != (FLOAT_TAG in b) or (TENSOR_TAG in a) != (TENSOR_TAG in b):
            return path, a, b, "type differs"
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


def _tensor_difference(a: dict, b: dict, path: str, tol: Optional[tuple[float, float]]):
    tagged_a, tagged_b = {TENSOR_TAG: a}, {TENSOR_TAG: b}
    if a.get("dtype") != b.get("dtype"):
        return path, tagged_a, tagged_b, "dtype differs"
    if a.get("shape") != b.get("shape"):
        return path, tagged_a, tagged_b, "shape differs"
    if a.get("hash") == b.get("hash"):
        return None
    if tol is not None:
        # With a tolerance, small tensors compare element-wise; larger ones by their
        # statistics (the exact contents are not kept, only their fingerprint).
        if "values" in a and "values" in b:
            xs, ys = _numbers(a["values"]), _numbers(b["values"])
        else:
            keys = sorted(set(a.get("stats", {})) & set(b.get("stats", {})))
            xs = _numbers(a["stats"][k] for k in keys)
            ys = _numbers(b["stats"][k] for k in keys)
        if all(x == y or _close(x, y, tol) for x, y in zip(xs, ys)):
            return None
    return path, tagged_a, tagged_b, "contents differ"


def _differences(
    step: int,
    rank: int,
    a: dict[str, Any],
    b: dict[str, Any],
    tolerance: Sequence[ToleranceRule],
    user_only: bool,
) -> list[Divergence]:
    """Every key that differs between one rank's records `a` and `b` of one step, the
    user's own keys first: they are what the report shows; the audit explains them."""
    keys = set(a) | set(b)
    if user_only:
        keys = {k for k in keys if not is_audit_key(k)}
    elif tolerance:
        # Watched tensors are kept as fingerprints only, which a tolerance cannot apply to;
        # RNG states stay exact either way.
        keys = {k for k in keys if not k.startswith("watch:")}
    found = []
    for key in sorted(keys, key=lambda k: (is_audit_key(k), k)):
        if key not in a or key not in b:
            run = "uninterrupted" if key in a else "resumed"
            diff = (key, a.get(key), b.get(key), f"recorded by the {run} run only")
        else:
            diff = value_difference(a[key], b[key], key, _tolerance_for(key, tolerance))
        if diff is not None:
            path, x, y, why = diff
            found.append(Divergence(step, rank, key, path, x, y, why))
    return found


def compare_runs(
    uninterrupted: dict[int, Signature],
    resumed: dict[int, Signature],
    split: int,
    steps: int,
    tolerance: Sequence[ToleranceRule] = (),
    user_only: bool = False,
    skip_steps: int = 0,
) -> Comparison:
    """Compare every rank of a resumed launch with the uninterrupted launch.

    `user_only` ignores the automatic audit keys and `skip_steps` the first resumed steps:
    the teeth check compares only what the user recorded after its mutation.
    """
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
            _step_problems(rank, uninterrupted[rank], resumed[rank], split, steps)
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
            here = _differences(
                step, rank, base_steps[rank][step], res_steps[rank][step], tolerance, user_only
            )
            if here:
                result.divergent_keys[rank] = [d.key for d in here]
                found += here
        if found:
            # Shown first: a key the user recorded (lowest rank, then name), else an audit key;
            # the audit explains a divergence, the user's values are what they recognise.
            result.divergence = min(found, key=lambda d: (is_audit_key(d.key), d.rank, d.key))
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
