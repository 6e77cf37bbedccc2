"""Structured facts a comparison or a check establishes (the data accounting, a topology's
envelopes, how a chain broke), each rendering its own lines.

A verdict keeps its facts as data, not as pre-flattened text: the failure report, the plan
summary, the JSON report and JUnit render them, and a pytest-xdist worker's verdicts travel
to the controller as JSON and come back as the same facts (`jsonable`). Each kind registers
its name, by which its JSON is read back; this module knows none of them.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Protocol, TypeVar


class Fact(Protocol):
    kind: ClassVar[str]

    def lines(self, label: str) -> list[str]:
        """The fact in words, for the failure report of the verdict `label` names (empty:
        nothing worth saying there)."""
        ...

    def summary(self, label: str) -> list[str]:
        """The fact in words, for the plan summary of a run (empty: the verdict's headline
        says it)."""
        ...


_KINDS: dict[str, type] = {}
F = TypeVar("F")


def fact(kind: str) -> Callable[[type[F]], type[F]]:
    """Class decorator: a fact kind (a dataclass), written and read back under `kind`."""

    def register(cls: type[F]) -> type[F]:
        cls.kind = kind  # type: ignore[attr-defined]
        _KINDS[kind] = cls
        return cls

    return register


def kind_of(cls: type) -> Optional[str]:
    """The kind `cls` is registered as, or None when it is no fact."""
    kind = getattr(cls, "kind", None)
    return kind if isinstance(kind, str) and _KINDS.get(kind) is cls else None


def fact_class(kind: Any) -> Optional[type]:
    """The class registered as `kind`, or None."""
    return _KINDS.get(kind) if isinstance(kind, str) else None
