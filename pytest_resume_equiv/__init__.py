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

from .rank.api import RunContext, context, record, resume_point, track, watch

__version__ = "0.2.0"
__all__ = [
    "RunContext",
    "context",
    "equivalent",
    "record",
    "resume_equivalent",
    "resume_point",
    "track",
    "watch",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # `resume_equivalent` is pytest's marker; resolved lazily so ranks never import pytest.
    if name in ("resume_equivalent", "equivalent"):
        import pytest

        return getattr(pytest.mark, name)
    raise AttributeError(f"module 'pytest_resume_equiv' has no attribute {name!r}")
