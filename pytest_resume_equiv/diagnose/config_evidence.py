"""What the causes of a difference between two configurations read (diagnose/at_configurations.py,
diagnose/configuration_counts.py): each run's steps up to the first that differs, and when two
numbers are the same ratio."""

from __future__ import annotations

from collections.abc import Iterator

from ..compare.configurations import ConfigurationFacts
from ..compare.global_step import GlobalStep
from ..compare.tolerance import ignored
from .rules import Stage

STAGE = (Stage.CONFIGURATION,)

CLOSE = 1e-3
"""Relative: a ratio is the accumulation or the world size when it is this close to it (the
round-off of two batchings is about 1e-7; the bugs differ by 1e-3 and more)."""
SAME = 1e-6
"""Relative: two of one rank's squared norms taken with nothing done in between agree to
this (the same tensors summed twice)."""
ROLES = ("variant", "baseline")
"""The runs a rule looks into, the variant first (the baseline is usually the plain one)."""


def first_step(facts: ConfigurationFacts) -> int:
    return min((d.step for d in facts.differences), default=0)


def runs(facts: ConfigurationFacts) -> Iterator[tuple[str, dict[int, GlobalStep]]]:
    for role, steps in zip(ROLES, (facts.variant_steps, facts.baseline_steps)):
        if steps:
            yield role, steps


def until_first(facts: ConfigurationFacts) -> Iterator[tuple[str, int, GlobalStep]]:
    """Each run's steps up to the first that differs: evidence from before the difference
    spread."""
    last = first_step(facts)
    for role, steps in runs(facts):
        for step in sorted(s for s in steps if s <= last):
            yield role, step, steps[step]


LEARNING_RATES = (".lr", ".last_lr")
"""How the differences of learning rates end (`watch:optimizer.lr`, `...last_lr`)."""


def learning_rates_differ(facts: ConfigurationFacts) -> bool:
    """Whether a learning rate differs at any step compared (not left out by `ignore=`)."""
    return any(d.what.endswith(LEARNING_RATES) for d in facts.differences)


def counted(facts: ConfigurationFacts, key: str) -> bool:
    """Whether the comparison counts `key` (its `ignore=` patterns leave out none of it): an
    ignored quantity is evidence of nothing."""
    return not ignored(key, facts.ignore)


def close(x: float, y: float, within: float = CLOSE) -> bool:
    return abs(x - y) <= within * max(abs(x), abs(y))
