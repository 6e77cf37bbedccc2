"""The doctor's answer: one row per check (ok / warn / fail, what was seen, the fix), as a
table a person reads at a glance and as JSON for a CI log."""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import asdict, dataclass
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
JSON_FORMAT = "pytest-resume-equiv/doctor"
JSON_VERSION = 1
SECTIONS = ("environment", "backends", "resume test", "determinism", "teardown")
"""The sections, in the order the doctor checks and prints them."""
NAME_WIDTH = 22
"""Widest check name shown beside what was seen; a longer one gets a line of its own."""


@dataclass(frozen=True)
class Row:
    section: str
    check: str
    status: str
    """ok: fine; warn: resume tests run, but something costs exactness or time; fail: it
    blocks resume tests on this machine."""
    seen: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES or self.section not in SECTIONS:
            raise ValueError(f"bad doctor row {self!r}")


def blocked(rows: list[Row]) -> bool:
    """Whether something keeps resume tests from running here (a failed row)."""
    return any(row.status == FAIL for row in rows)


def table(rows: list[Row], width: int = 0) -> str:
    """The rows under their sections: status, check, what was seen; the fix below it."""
    width = width or max(60, min(120, shutil.get_terminal_size((100, 20)).columns))
    name_width = min(NAME_WIDTH, max((len(row.check) for row in rows), default=0)) + 2
    indent = " " * (7 + name_width)
    lines: list[str] = []
    for section in SECTIONS:
        here = [row for row in rows if row.section == section]
        if not here:
            continue
        lines.append(section)
        for row in here:
            head = f"  {row.status:<5}{row.check:<{name_width}}"
            if len(head) > len(indent):  # a long name: what was seen starts below it
                lines.append(head.rstrip())
                head = indent
            lines += textwrap.wrap(
                row.seen,
                width,
                initial_indent=head,
                subsequent_indent=indent,
                break_on_hyphens=False,
            ) or [head.rstrip()]
            if row.fix:
                lines += textwrap.wrap(
                    f"fix: {row.fix}",
                    width,
                    initial_indent=indent,
                    subsequent_indent=indent + "     ",
                    break_on_hyphens=False,
                )
    counts = {status: sum(row.status == status for row in rows) for status in STATUSES}
    verdict = (
        "resume tests are blocked on this machine"
        if blocked(rows)
        else "resume tests can run on this machine"
    )
    lines.append(f"{verdict}: {counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines)


def to_json(rows: list[Row], facts: dict[str, Any]) -> dict[str, Any]:
    """The JSON form: what was asked and picked (`facts`), every row, and the exit status."""
    return {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        **facts,
        "blocked": blocked(rows),
        "rows": [asdict(row) for row in rows],
    }
