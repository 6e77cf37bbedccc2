"""What a crash check's verdict holds and says: the table of its points (one row each), and
the cause a failed row gets from what the crash left."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..compare import facts
from ..diagnose import Diagnosis, Stage, cause
from ..diagnose.at_crash import AfterCrash
from ..signature import count
from .after_crash import TORN, Row
from .base import Verdict

CAUSED_BY_THE_CRASH = (
    TORN,
    "crashed on the torn checkpoint",
    "crashed on the empty",
    "the restarted job could not save",
)
"""The failed rows whose cause is what the crash left (`Stage.CRASH`), not one object's
restore."""
CATCH_ALL = "crash.torn-by-the-crash"


def crash_cause(facts: AfterCrash, why: str) -> Optional[Diagnosis]:
    """The cause of a failed point from what the crash left (diagnose/at_crash.py): for a
    row whose verdict says the crash is to blame (`why`), the catch-all of at_check.py too;
    for another (lost a checkpoint, diverged), only a rule that reads the disk."""
    found = cause(Stage.CRASH, facts)
    if why.startswith(CAUSED_BY_THE_CRASH) or (found is not None and found.rule != CATCH_ALL):
        return found
    return None


@facts.fact("crash_table")
@dataclasses.dataclass
class CrashTable:
    """One row per crash point: where it was killed, what was on disk, where the resumed run
    started, and the verdict."""

    split: int
    rows: list[Row]
    sampled: str = ""
    """`crash_points=N`: how they were drawn (`3 of 11, seed 0`)."""
    rerun_args: str = ""
    """The options a pytest line needs beside the point's id to rerun one point alone."""

    def lines(self, label: str) -> list[str]:
        width = max((len(r.point) for r in self.rows), default=5)
        sampled = f" ({self.sampled})" if self.sampled else ""
        lines = [
            f"{label}: {count(len(self.rows), 'crash point')}{sampled} in the save at step {self.split}"
        ]
        for row in self.rows:
            lines.append(f"  {row.point:<{width}}  {row.where}")
            if row.then:
                lines.append(f"  {'':<{width}}  then: {row.then}")
            if row.rolled_back:
                lines.append(f"  {'':<{width}}  rolled back: {row.rolled_back}")
            lines.append(f"  {'':<{width}}  on disk: {row.disk or '?'}")
            lines.append(f"  {'':<{width}}  -> {row.status.upper()}: {row.why}")
        return lines

    def summary(self, label: str) -> list[str]:
        return self.lines(label)


def table_of(verdict: Verdict) -> Optional[CrashTable]:
    return next((f for f in verdict.facts if isinstance(f, CrashTable)), None)
