"""One random stream is one stream, whatever name each run gave it.

The audit names a `torch.Generator` by the line that made it. A correct resume can make the
same generator on another line (its restore function builds it again and gives it the saved
state), so the two runs hold it under two names; compared by name, the same stream looks
"recorded by one run only" in both. Before anything is compared, each generator stream one run
holds and the other lacks at a step (or at the resume point) is matched against the other
run's unmatched generators there by state: an equal state is the same stream, and the resumed
run's name gives way to the uninterrupted run's. Streams whose states differ stay apart, and
stay a finding, as any difference does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..rank.layout import GENERATOR, RNG, audit_key, split_key, stream_kind
from ..signature import Signature

Run = dict[int, Signature]
Renames = dict[str, str]
"""A resumed run's stream key -> the uninterrupted run's key for the same stream."""


def same_streams(reference: Run, run: Run) -> Run:
    """`run` with each generator stream that equals, in state, one `reference` holds under
    another name at the same step (or resume point) renamed to that name."""
    return {
        rank: _renamed(reference[rank], sig) if rank in reference else sig
        for rank, sig in run.items()
    }


def pair_by_state(base: dict[str, Any], res: dict[str, Any]) -> Renames:
    """Keys of generator streams `res` holds and `base` does not, each paired with a key
    `base` holds and `res` does not whose value is the same (first by name when several)."""
    unmatched = sorted(k for k in base if k not in res and _is_generator(k))
    pairs: Renames = {}
    for key in sorted(k for k in res if k not in base and _is_generator(k)):
        twin = next((k for k in unmatched if base[k] == res[key]), None)
        if twin is not None:
            pairs[key] = twin
            unmatched.remove(twin)
    return pairs


def _is_generator(key: str) -> bool:
    return stream_kind(key) == GENERATOR


def _renamed(base: Signature, res: Signature) -> Signature:
    base_steps = base.by_step()
    steps = []
    changed = False
    for step, values in res.steps:
        pairs = pair_by_state(base_steps.get(step, {}), values)
        changed = changed or bool(pairs)
        steps.append((step, _rename_keys(values, pairs)))
    points, restore_renames = [], {}
    for point in res.resume_points:
        base_point = base.resume_point(point.get("split"))
        pairs = _point_pairs(base_point, point)
        changed = changed or bool(pairs)
        restore_renames.update(pairs)
        points.append(_rename_point(point, pairs))
    if not changed:
        return res
    restores = [
        {**entry, "what": restore_renames.get(entry.get("what"), entry.get("what"))}
        for entry in res.restores
    ]
    return dataclasses.replace(res, steps=steps, resume_points=points, restores=restores)


def _point_pairs(base: Optional[dict], res: dict) -> Renames:
    """The pairs of a resume point's streams, as full keys (`rng:generator ...`)."""
    if base is None:
        return {}

    def keys(point: dict) -> dict[str, Any]:
        return {audit_key(RNG, name): v for name, v in (point.get(RNG) or {}).items()}

    return pair_by_state(keys(base), keys(res))


def _rename_keys(values: dict[str, Any], pairs: Renames) -> dict[str, Any]:
    return {pairs.get(k, k): v for k, v in values.items()} if pairs else values


def _rename_point(point: dict, pairs: Renames) -> dict:
    if not pairs:
        return point
    names = {split_key(a)[1]: split_key(b)[1] for a, b in pairs.items()}
    draws = [
        {**d, "stream": pairs.get(d.get("stream"), d.get("stream"))} for d in point.get("draws", [])
    ]
    return {**point, RNG: _rename_keys(point.get(RNG) or {}, names), "draws": draws}
