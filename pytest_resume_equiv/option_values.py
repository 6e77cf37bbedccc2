"""How an option's raw value (from an ini file, the environment or the command line) is read:
each parser returns the value or raises ValueError saying what was expected; `settings.py`
adds where the bad value came from."""

from __future__ import annotations

import os
import shlex
from typing import Any, Callable, Optional


def choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = str(raw).strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true/false (1/0, yes/no, on/off)")


def whole_number(least: int, of: str = "") -> Callable[[Any], int]:
    """An int >= `least` (`of`: what it counts, for the message)."""
    expected = f"expected a whole number{' of ' + of if of else ''} >= {least}"

    def parse(raw: Any) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(expected) from None
        if value < least:
            raise ValueError(expected)
        return value

    return parse


def non_empty(expected: str, user: bool = False) -> Callable[[Any], Optional[str]]:
    """A string that must not be empty (`user`: a path, `~` expanded)."""

    def parse(raw: Any) -> Optional[str]:
        value = str(raw).strip()
        value = os.path.expanduser(value) if user else value
        if not value:
            raise ValueError(f"expected {expected}")
        return value

    return parse


def parse_slurm_args(raw: Any) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(str(raw)))
    except ValueError as exc:
        raise ValueError(f"not a shell-quoted list of srun options ({exc})") from None


def parse_preload(raw: Any) -> tuple[str, ...]:
    """Comma-separated module names (`transformers,diffusers`)."""
    names = tuple(n.strip() for n in str(raw).split(",") if n.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(
                f"{name!r} is not a module name (expected e.g. transformers,diffusers)"
            )
    return names


def point_id_split(value: str) -> Optional[int]:
    """The split a crash point's id names (`s4.torn1`: 4), or None for no such id."""
    head, dot, _ = value.partition(".")
    return int(head[1:]) if dot and head[:1] == "s" and head[1:].isdigit() else None


def parse_crash_point(raw: Any) -> Optional[str]:
    """A crash point's id (`s4.torn1`: `checks.crash_points.CrashPoint.id`); empty: none."""
    value = str(raw).strip()
    if not value:
        return None
    if point_id_split(value) is None:
        raise ValueError(
            "expected a crash point's id as the report's rerun line names it, e.g. s4.torn1"
        )
    return value
