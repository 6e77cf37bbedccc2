"""pytest-resume-equiv: resuming from a checkpoint must give exactly the uninterrupted run.

In a trainer (no pytest needed; every call is a no-op outside a test run)::

    import pytest_resume_equiv as req
    req.record(step, loss=loss, noise=noise)

In a test::

    from pytest_resume_equiv import resume_equivalent

    @resume_equivalent(steps=6, split=3, nproc=2)
    def test_resumes(resume_equiv): ...

This module imports neither pytest nor torch, so trainers pay nothing for importing it.
"""

from __future__ import annotations

from typing import Any

from .rank.context import RunContext, context
from .rank.record import record
from .rank.rng import track as _track
from .rank.watch import watch

__version__ = "0.2.0"
__all__ = [
    "RunContext",
    "context",
    "record",
    "resume_equivalent",
    "resume_point",
    "track",
    "watch",
    "__version__",
]


def track(generator: Any, name: str, ignore: bool = False) -> None:
    """Audit `generator` under `name` at every `record` (a no-op outside a test run).
    `ignore=True` leaves it out of the comparison (an evaluation-only generator, say); the
    report lists it as ignored."""
    if context() is not None:
        _track(generator, name, ignore=ignore)


def resume_point() -> None:
    """Mark the start of a training step: the first one after a load is the resume point,
    where the diagnosis compares what was restored with the uninterrupted run at the same
    point. Optional (by default the first forward of any module is that point); call it at
    the start of every step, in every run. A no-op outside a test run."""
    ctx = context()
    if ctx is not None:
        from .rank import record as _record
        from .rank import resume_point as _point

        _point.mark(ctx, _record.writer())


def __getattr__(name: str) -> Any:
    # `resume_equivalent` is pytest's marker; resolved lazily so ranks never import pytest.
    if name == "resume_equivalent":
        import pytest

        return pytest.mark.resume_equivalent
    raise AttributeError(f"module 'pytest_resume_equiv' has no attribute {name!r}")
