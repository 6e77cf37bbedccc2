"""The resume point as an exact gate.

What a resumed run holds right before its first step (every watched object's fingerprints,
every audited random stream, the data loader's state, the step counters) must equal, bit for
bit, what the launch that wrote the checkpoint held at the same program point, and the first
resumed step must consume the same samples. A load is a copy: noise in the arithmetic (atomics,
split-K, another kernel) cannot change it. So the gate holds under every tolerance and every
measured noise, and a difference there is the resume's doing.

The reference is the launch that wrote the checkpoint: the uninterrupted run
(`interrupt="continue"`), or the interrupted launch itself (`"kill"` goes on past the split and
takes its snapshot at the same point). Where that launch took no snapshot there (`"stop"`
ends at the split), the uninterrupted run stands in for the parts no arithmetic touches
(random streams, counters, the loader, train/eval flags) and the float state is not gated.
Snapshots taken at different places (a forward of another module, another line) are not
compared: the gate then says it could not judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..signature import Signature
from . import facts
from .accounting import is_identity_key
from .tolerance import ComparisonRules, ignored, latent

Run = dict[int, Signature]

FLOAT_PARTS = ("params", "buffers", "state", "tensor", "value")
"""Watched parts that hold float contents: what another launch's arithmetic may change."""
SECTIONS = ("rng", "watch")


@facts.fact("gate")
@dataclass
class GateFacts:
    status: str
    """held | failed | unknown (no snapshot to judge, or snapshots of different places)."""
    reference: str = "the uninterrupted run"
    why: str = ""
    """unknown: why it could not judge; held: what it did not gate."""
    differing: dict[str, list[str]] = field(default_factory=dict)
    """rank -> the items that differ at the resume point."""
    compared: int = 0
    """Items compared on every rank together."""
    at: str = ""
    """Where the snapshots were taken (the lowest judged rank's)."""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def held(self) -> bool:
        return self.status == "held"

    def lines(self, label: str) -> list[str]:
        if not self.failed:
            return []
        where = "; ".join(f"rank {r}: {', '.join(keys[:6])}" for r, keys in self.differing.items())
        if all(is_identity_key(k) for keys in self.differing.values() for k in keys):
            return [
                f"{label}: at the resume point ({self.at}) every restored state equals "
                f"{self.reference}'s, but the first resumed step consumed other data: {where}. "
                "The resume did not put the data where it was"
            ]
        return [
            f"{label}: at the resume point ({self.at}) the resumed run's state differs from "
            f"{self.reference}'s at the same point: {where}. A load is a copy, so no noise "
            "in the arithmetic explains this: the resume restored something other than what was "
            "saved"
        ]

    def summary(self, label: str) -> list[str]:
        return []

    def words(self) -> str:
        """One line for the plan summary and reports that list what was compared."""
        if self.held:
            extra = f"; {self.why}" if self.why else ""
            return f"resume point exact against {self.reference} ({self.compared} items){extra}"
        if self.failed:
            return f"resume point differs from {self.reference}'s"
        return f"resume point not gated: {self.why}"


def _items(point: dict[str, Any], floats: bool) -> dict[str, Any]:
    """The snapshot's gated items as audit keys (`rng:cpu`, `watch:model.params`)."""
    items = {}
    for section in SECTIONS:
        for name, value in (point.get(section) or {}).items():
            if section == "watch" and not floats and name.rsplit(".", 1)[-1] in FLOAT_PARTS:
                continue
            items[f"{section}:{name}"] = value
    return items


def _rank_gate(
    rank: int,
    ref: Signature,
    res: Signature,
    split: int,
    rules: ComparisonRules,
    floats: bool,
) -> tuple[Optional[list[str]], int, str]:
    """(the differing items or None when this rank cannot be judged, items compared, where
    or why not)."""
    a, b = ref.resume_point(split), res.resume_point(split)
    if a is None or b is None:
        run = "the resumed run" if b is None else "the reference run"
        return None, 0, f"{run} took no snapshot at the resume point on rank {rank}"
    if a.get("at") != b.get("at"):
        return (
            None,
            0,
            (
                f"rank {rank}'s snapshots were taken at different places ({a.get('at')} and "
                f"{b.get('at')}): not the same program point"
            ),
        )
    x, y = _items(a, floats), _items(b, floats)
    names = [*rules.ignore, *ref.ignored, *res.ignored]
    keys = [k for k in sorted(set(x) | set(y)) if not ignored(k, names)]
    base_steps, res_steps = ref.by_step(), res.by_step()
    first = res_steps.get(split + 1, {})
    ids = [k for k in first if is_identity_key(k)]
    differing = [
        k
        for k in keys
        if x.get(k) != y.get(k)
        and (rules.strict_latent or not latent(k, base_steps, res_steps, split))
    ]
    differing += [k for k in ids if base_steps.get(split + 1, {}).get(k) != first.get(k)]
    return differing, len(keys) + len(ids), str(b.get("at", ""))


def gate(
    reference: Run,
    source: Optional[Run],
    run: Run,
    split: int,
    rules: ComparisonRules,
) -> GateFacts:
    """Judge the resumed `run`'s resume point against the launch that wrote its checkpoint
    (`source`; None: the uninterrupted `reference` wrote it)."""
    against, floats, name, why = reference, True, "the uninterrupted run", ""
    if source is not None:
        took = all(s.resume_point(split) is not None for s in source.values())
        if took:
            against, name = source, "the interrupted launch"
        else:
            floats = False
            why = (
                "the interrupted launch took no snapshot at that point, so its float state "
                "(parameters, buffers, optimizer state) is not gated"
            )
    result = GateFacts("held", name, why)
    reasons = []
    for rank, sig in sorted(run.items()):
        ref = against.get(rank)
        if ref is None:
            continue
        differing, compared, where = _rank_gate(rank, ref, sig, split, rules, floats)
        if differing is None:
            reasons.append(where)
            continue
        result.compared += compared
        result.at = result.at or where
        if differing:
            result.differing[str(rank)] = differing
    if result.differing:
        result.status = "failed"
    elif not result.compared:
        result.status, result.why = "unknown", reasons[0] if reasons else "no rank to judge"
    elif reasons:
        result.why = "; ".join(filter(None, [why, *reasons]))
    return result
