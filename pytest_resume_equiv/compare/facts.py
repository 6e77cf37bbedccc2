"""Structured facts a comparison or a check establishes (the data accounting, a topology's
envelopes, how a chain broke), each rendering its own lines.

A verdict keeps its facts as data, not as pre-flattened text: the failure report, the plan
summary, the JSON report and JUnit render them, and a pytest-xdist worker's verdicts travel
to the controller as JSON and come back as the same facts. Each kind registers how it is read
back; this module knows none of them.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, TypeVar


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

    def to_json(self) -> dict[str, Any]: ...


_READERS: dict[str, Callable[[dict[str, Any]], Any]] = {}
F = TypeVar("F")


def fact(kind: str) -> Callable[[type[F]], type[F]]:
    """Class decorator: a fact kind, read back by its `from_json` classmethod."""

    def register(cls: type[F]) -> type[F]:
        cls.kind = kind  # type: ignore[attr-defined]
        _READERS[kind] = cls.from_json  # type: ignore[attr-defined]
        return cls

    return register


def to_json(item: Fact) -> dict[str, Any]:
    return {"kind": item.kind, **item.to_json()}


def from_json(data: dict[str, Any]) -> Fact:
    reader = _READERS.get(str(data.get("kind")))
    if reader is None:
        raise ValueError(f"unknown kind of fact {data.get('kind')!r}")
    return reader({k: v for k, v in data.items() if k != "kind"})
