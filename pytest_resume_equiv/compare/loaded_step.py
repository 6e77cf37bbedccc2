"""Which step the checkpoint a resumed launch loaded is of, from the step counters its load
restored (automatic recording: optimizer `step`, scheduler `last_epoch`, rank/auto.py) read
against the counters the uninterrupted run had after each step.

A resumed launch numbers its first step `split + 1`; when the load says otherwise ("the
checkpoint loaded is of step 6, not step 3") that is a finding, never a silent renumbering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..signature import Signature
from . import facts

Run = dict[int, Signature]


@facts.fact("loaded_step")
@dataclass
class LoadedStep:
    split: int
    found: dict[str, int] = field(default_factory=dict)
    """rank -> the step the loaded counters belong to, where it is not the split."""
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    """rank -> the counters the load restored."""

    @property
    def failed(self) -> bool:
        return bool(self.found)

    def lines(self, label: str) -> list[str]:
        if not self.failed:
            return []
        steps = sorted(set(self.found.values()))
        ranks = ", ".join(f"rank {r}" for r in self.found)
        shown = ", ".join(f"{k} {v}" for k, v in next(iter(self.counters.values())).items())
        which = " or ".join(map(str, steps))
        return [
            f"{label}: the checkpoint loaded is of step {which}, not step {self.split} "
            f"({ranks}: its step counters, {shown}, are the uninterrupted run's after step "
            f"{which}); the resumed run went on as if from step {self.split}. Load the "
            f"checkpoint saved at step {self.split} (a 'latest' link or a rolling path may "
            "point at a later save)"
        ]

    def summary(self, label: str) -> list[str]:
        return self.lines(label)


def loaded_step(reference: Run, run: Run, split: int) -> Optional[LoadedStep]:
    """The finding, or None when no rank recorded what its load restored, or it agrees."""
    result = LoadedStep(split)
    for rank, sig in sorted(run.items()):
        loaded = (sig.loaded or {}).get("counters")
        base = reference.get(rank)
        if not loaded or base is None or not base.counters:
            continue
        at_split = base.counters.get(split)
        if at_split is not None and _agrees(loaded, at_split):
            continue
        matching = [s for s, c in sorted(base.counters.items()) if _agrees(loaded, c)]
        if matching and split not in matching:
            result.found[str(rank)] = matching[0]
            result.counters[str(rank)] = dict(loaded)
    return result if result.failed else None


def _agrees(loaded: dict[str, int], after: dict[str, int]) -> bool:
    shared = set(loaded) & set(after)
    return bool(shared) and all(loaded[k] == after[k] for k in shared)
