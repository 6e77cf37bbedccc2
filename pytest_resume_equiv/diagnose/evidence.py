"""What every rule of the diagnosis reads, built once per divergence: the keys that differ
at the first divergent step, both runs' records per step, their resume-point snapshots, the
restore logs and the draws traced before the first resumed step; and the small helpers the
rules share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ..compare.accounting import DataAccount
from ..compare.comparators import data_accounts
from ..compare.diff import Comparison, value_difference
from ..rank.encode import decode_float
from ..rank.layout import AUTO, audit_key, watch_key, watched, watched_part
from ..signature import Signature

Steps = dict[int, dict[int, dict[str, Any]]]
"""rank -> step -> key -> encoded value."""

LOSS_KEY = audit_key(AUTO, "loss")
"""One value per `backward()` of the step (automatic recording): its micro-batches."""
LOW_PRECISION_GAP = 1e-2
"""Relative norm difference below which differing weights count as rounding-level
(bf16 keeps about 3 significant digits)."""


@dataclass
class Evidence:
    """`base` / `res`: the uninterrupted and resumed runs, rank -> step -> values."""

    cmp: Comparison
    differing: dict[int, list[str]]
    base: Steps
    res: Steps
    step: int
    split: int
    base_sigs: dict[int, Signature] = field(default_factory=dict)
    res_sigs: dict[int, Signature] = field(default_factory=dict)
    accounts: list[DataAccount] = field(default_factory=list)
    """The comparison's data accounting, per identity key (read once, by every rule)."""

    @classmethod
    def of(cls, cmp: Comparison, base: dict[int, Signature], res: dict[int, Signature]) -> Evidence:
        differing = {rank: keys for rank, keys in sorted(cmp.divergent_keys.items()) if keys}
        return cls(
            cmp,
            differing,
            {rank: sig.by_step() for rank, sig in base.items()},
            {rank: sig.by_step() for rank, sig in res.items()},
            cmp.divergence.step if cmp.divergence else cmp.split + 1,
            cmp.split,
            base,
            res,
            data_accounts(cmp, base, res),
        )

    def where(self, rank: int) -> str:
        return f"rank {rank}, step {self.step}"

    def points(self, rank: int) -> tuple[Optional[dict], Optional[dict]]:
        """Both runs' resume-point snapshots of `rank` for this split (None where missing)."""
        base, res = self.base_sigs.get(rank), self.res_sigs.get(rank)
        return (
            base.resume_point(self.split) if base else None,
            res.resume_point(self.split) if res else None,
        )

    def restores(self, rank: int) -> list[dict[str, Any]]:
        """The resumed run's restore log on `rank`."""
        sig = self.res_sigs.get(rank)
        return sig.restores if sig else []

    def saved_at(self, rank: int) -> Optional[int]:
        """When the uninterrupted run's `rank` last wrote to the checkpoint the resumed run
        loaded, by the split (its file events; None when it logged none there)."""
        _, res = self.points(rank)
        path = ((res or {}).get("checkpoint") or {}).get("path")
        sig = self.base_sigs.get(rank)
        if not path or sig is None:
            return None
        path = os.path.realpath(path)
        times = [
            e.get("time_ns", 0)
            for e in sig.files
            if touches(e, path) and (e.get("after_step") or 0) <= self.split
        ]
        return max(times, default=None)


def touches(event: dict, path: str) -> bool:
    """Whether a file event wrote (or renamed, or deleted) something at or under `path`."""
    inside = [event.get("path") or "", event.get("to") or ""]
    return any(p == path or p.startswith(path.rstrip(os.sep) + os.sep) for p in inside if p)


def norm_gap(a: Any, b: Any) -> Optional[float]:
    """Largest relative norm difference between two `{name: {hash, norm}}` sections."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    gaps = []
    for name in set(a) & set(b):
        x, y = decode_float(a[name].get("norm")), decode_float(b[name].get("norm"))
        if x is None or y is None:
            return None
        gaps.append(abs(x - y) / max(abs(x), abs(y), 1e-30))
    return max(gaps) if gaps else None


def first_diff_name(a: Any, b: Any) -> str:
    found = value_difference(a, b, "", None)
    if not found:
        return ""
    path = found[0]
    return path.split("'")[1] if "'" in path else path


def borrowed_from(base: Steps, res: Steps, rank: int, step: int, key: str) -> Optional[int]:
    """The other rank whose stream `rank` resumed with (rank 0's saved everywhere, or state
    keyed by local rank so two nodes' ranks read one file), if any."""
    value = res[rank].get(step, {}).get(key)
    if value is None or base[rank].get(step, {}).get(key) == value:
        return None
    for other in sorted(base, key=lambda r: (r != 0, r)):
        if other != rank and base[other].get(step, {}).get(key) == value:
            return other
    return None


def lr_shift(base: Steps, res: Steps, rank: int, step: int, key: str) -> Optional[int]:
    value = res[rank][step].get(key)
    for shift in (-1, 1):
        other = base[rank].get(step + shift, {}).get(key)
        if other is not None and other == value:
            return shift
    return None


def scheduler_restarted(
    base: Steps, res: Steps, rank: int, step: int, split: int
) -> Optional[bool]:
    """True: the resumed scheduler counts from the resume; False: off by one; None: unknown."""
    for key, value in res[rank][step].items():
        if watched_part(key) == "last_epoch":
            ours, theirs = value, base[rank][step].get(key)
            if not isinstance(ours, int) or not isinstance(theirs, int) or ours == theirs:
                return None
            if ours <= step - split < theirs:
                return True
            return False if abs(ours - theirs) == 1 else None
    return None


CONTENT_KEYS = ("batch", "x", "input", "inputs", "sample", "samples", "data", "images", "latents")


def is_content_key(key: str) -> bool:
    return key.lower() in CONTENT_KEYS


def optimizer_steps_differ(base: Steps, res: Steps, rank: int, step: int, keys: list[str]) -> bool:
    """Whether an optimizer's per-parameter `step` counts differ between the runs."""
    for key in keys:
        obj, part = watched(key)
        if part != "state" or not is_optimizer(base[rank][step], obj):
            continue
        a, b = base[rank][step].get(key) or {}, res[rank][step].get(key) or {}
        for name in set(a) & set(b):
            if (
                isinstance(a[name], dict)
                and isinstance(b[name], dict)
                and a[name].get("step") != b[name].get("step")
            ):
                return True
    return False


def is_optimizer(values: dict[str, Any], obj: str) -> bool:
    """Whether the watched object `obj` is an optimizer (it has learning rates)."""
    return watch_key(obj, "lr") in values


def lost_micro_batches(base: object, res: object) -> Optional[int]:
    """How many micro-batches of a step the resumed run lost: its losses (one per backward)
    are the uninterrupted run's last ones, bit for bit; None when they are not."""
    if not isinstance(base, list) or not isinstance(res, list) or not 0 < len(res) < len(base):
        return None
    return len(base) - len(res) if base[len(base) - len(res) :] == res else None
