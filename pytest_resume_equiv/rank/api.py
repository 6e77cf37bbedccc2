"""The in-rank calls a trainer makes (`import pytest_resume_equiv as req`). Each records into
this process's rank state (rank/context.py) and is a no-op outside a test run."""

from __future__ import annotations

from typing import Any

from .context import RunContext, context, current

__all__ = ["RunContext", "context", "record", "resume_point", "track", "watch"]


def record(step: int, **values: Any) -> None:
    """Record this rank's values at the end of `step` (a no-op outside a test run)."""
    current().record(step, values)


def watch(**objects: Any) -> None:
    """Fingerprint these objects at every `record` from now on (a no-op outside a test run)."""
    current().watch(objects)


def track(generator: Any, name: str, ignore: bool = False) -> None:
    """Audit `generator` under `name` at every `record` (a no-op outside a test run).
    `ignore=True` leaves it out of the comparison (an evaluation-only generator, say); the
    report lists it as ignored."""
    current().track(generator, name, ignore=ignore)


def resume_point() -> None:
    """Mark the start of a training step: the first one after a load is the resume point,
    where the diagnosis compares what was restored with the uninterrupted run at the same
    point. Optional (by default the first forward of any module is that point); call it at
    the start of every step, in every run. A no-op outside a test run."""
    current().mark_resume_point()
