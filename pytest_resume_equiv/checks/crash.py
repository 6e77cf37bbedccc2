"""interrupt="crash": kill the run inside its save at the last split, at every point the
uninterrupted run's file events show, and judge what the trainer's own resume logic does then.

The points are known only once the uninterrupted launch has run, so this check plans its
launches then: per point one crash launch (every rank SIGKILLed at the point,
`rank/crasher.py`) and one resumed launch, run as a restarted job: before it starts, what the
crash launch left in its run directory is laid out in the resumed launch's own, and its
`{run_dir}` and `{checkpoint}` name that one, so it resumes from and saves into the same
folders whatever form the test is written in. With crash_mode="power", a point's crash
launch is also rolled back to what a power loss leaves before that copy is made
(`power_loss.py`: every write not yet fsynced undone). One verdict: a table of the points, and
the first failing point's full judgement.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from ..compare import facts
from ..diagnose import Diagnosis, Stage, cause
from ..diagnose.at_crash import AfterCrash
from ..errors import ResumeEquivError
from ..launch.running import LaunchResult
from ..plan import PlannedLaunch, Planner
from ..rank.run_dir import crash_record_path, signature_path
from ..signature import SignatureError, read_signature
from .after_crash import (
    EXACT,
    REFUSED,
    TORN,
    Row,
    after_crash,
    judge_after_crash,
    read_crash_record,
)
from .base import Check, Judging, Outcome, Verdict
from .crash_points import CrashPoint, crashed_where, find_points, lay_out, on_disk
from .launches import one_group, uninterrupted_of
from .power_loss import merged, roll_back, rolled_back_words, unsynced
from .resume import ResumeLike, format_diagnosis

GROUPS = (
    'interrupt="crash" needs one uninterrupted launch that saves at every split, but the '
    "command differs per split (it uses {split}); use {splits}, or ctx.should_save(step)"
)


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

    def lines(self, label: str) -> list[str]:
        width = max((len(r.point) for r in self.rows), default=5)
        lines = [f"{label}: {len(self.rows)} crash points in the save at step {self.split}"]
        for row in self.rows:
            lines.append(f"  {row.point:<{width}}  {row.where}")
            if row.rolled_back:
                lines.append(f"  {'':<{width}}  rolled back: {row.rolled_back}")
            lines.append(f"  {'':<{width}}  on disk: {row.disk or '?'}")
            lines.append(f"  {'':<{width}}  -> {row.status.upper()}: {row.why}")
        return lines

    def summary(self, label: str) -> list[str]:
        return self.lines(label)


def _table(verdict: Verdict) -> Optional[CrashTable]:
    return next((f for f in verdict.facts if isinstance(f, CrashTable)), None)


@dataclasses.dataclass
class Pair:
    point: CrashPoint
    crash: PlannedLaunch
    resumed: PlannedLaunch
    row: Row
    record: Optional[dict] = None
    """The crash launch's record of where it was killed."""
    rolled_back: Optional[list[dict]] = None
    """A power-loss point: the writes its rollback undid (`power_loss.roll_back`)."""


class Crash(Check):
    kind = "crash"

    def __init__(self, planner: Planner, full: PlannedLaunch) -> None:
        super().__init__([full])
        self.planner = planner
        self.full = full
        self.split = planner.marker.splits[-1]
        self.label = f"crash at split {self.split}"
        self.pairs: list[Pair] = []

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        if planner.marker.interrupt != "crash":
            return []
        one_group(planner, GROUPS)
        if "{run_dir}" not in planner.checkpoint:
            raise ResumeEquivError(
                f'interrupt="crash" needs checkpoint= under {{run_dir}} (got '
                f"{planner.checkpoint!r}): every crash launch tears its own copy, e.g. "
                "checkpoint='{run_dir}/checkpoints' for a trainer that finds its latest "
                "checkpoint there"
            )
        return [cls(planner, uninterrupted_of(planner, planner.marker.splits[-1]))]

    def on_done(self, launch: PlannedLaunch, judge: Judging) -> None:
        if launch is self.full:
            self.start_points(judge)
            return
        pair = next(p for p in self.pairs if launch in (p.crash, p.resumed))
        if launch is pair.crash:
            self.crashed(pair, judge)
        else:
            self.resumed(pair, judge)
        if all(p.row.status != "pending" for p in self.pairs):
            self.conclude(judge)

    def start_points(self, judge: Judging) -> None:
        """The uninterrupted run's save, split into points: a crash and a resume for each."""
        marker, planner = self.planner.marker, self.planner
        run_dir = self.full.spec.run_dir
        full = judge.signatures(self.full)
        modes = marker.crash_mode
        points = find_points(full, self.split, marker.splits, marker.crash_points, run_dir, modes)
        for number, point in enumerate(points, start=1):
            name = f"crash-{number}"
            crash = planner.saving(
                name,
                "crash",
                marker.splits,
                os.path.join(planner.root, name),
                marker.steps,
                phase="interrupted",
            )
            context = dataclasses.replace(crash.spec.context, crash=point.to_context())
            crash.spec = dataclasses.replace(crash.spec, context=context)
            resumed = planner.resuming(
                f"resumed-{name}", "resumed", self.split, self.full, crash, own_root=True
            )
            context = dataclasses.replace(resumed.spec.context, picks_checkpoint=True)
            resumed.spec = dataclasses.replace(resumed.spec, context=context)
            crash.may_fail = resumed.may_fail = True
            row = Row(point.name, point.where(run_dir), status="pending")
            self.pairs.append(Pair(point, crash, resumed, row))
            self.launches += [crash, resumed]
            judge.start(crash)
            judge.start(resumed)

    def crashed(self, pair: Pair, judge: Judging) -> None:
        """The crash launch ended: where it was killed, what it left on disk."""
        run_dir = pair.crash.spec.run_dir
        record = pair.record = read_crash_record(crash_record_path(run_dir))
        result = judge.result(pair.crash)
        if record is not None:
            pair.row.where = result.crashed = crashed_where(record, run_dir)
            if pair.point.power:
                self.power_lost(pair, result)
            pair.row.disk = on_disk(run_dir)
            lay_out(run_dir, pair.resumed.spec.run_dir)  # the restarted job's folders
            return
        pair.row.disk = on_disk(run_dir)
        how = "finished" if result.ok else f"ended ({result.status})"
        pair.row.status = "not reached"
        pair.row.why = (
            f"the crash launch {how} without reaching this point: its save at step {self.split} "
            "wrote fewer events than the uninterrupted run's"
        )
        judge.cancel(pair.resumed)

    def power_lost(self, pair: Pair, result: LaunchResult) -> None:
        """A power loss at the kill: every write of the crash launch's ranks (their file
        events) not yet durable is rolled back in its run directory."""
        run_dir = pair.crash.spec.run_dir
        logs = []
        for rank in range(result.spec.world_size):
            try:
                logs.append(read_signature(signature_path(run_dir, rank)).files)
            except SignatureError:  # a rank killed before it wrote any
                pass
        events = merged(logs)
        pair.rolled_back = roll_back(unsynced(events), run_dir)
        pair.row.where += ", then a power loss"
        pair.row.rolled_back = rolled_back_words(pair.rolled_back)

    def resumed(self, pair: Pair, judge: Judging) -> None:
        if pair.row.status != "pending":
            return
        result = judge.result(pair.resumed)
        try:
            run = judge.signatures(pair.resumed)
        except ResumeEquivError:
            run = None
        splits = self.planner.marker.splits
        completed = [s for s in splits if s < self.split] + (
            [self.split] if pair.point.completes else []
        )
        refusal = self.planner.marker.crash_refusal
        row = judge_after_crash(
            pair.row, result, judge.signatures(self.full), run, completed, judge.comparator, refusal
        )
        for run_dir in (pair.crash.spec.run_dir, pair.resumed.spec.run_dir):
            row.why = row.why.replace(run_dir + os.sep, "")  # its paths, short
        if row.status == REFUSED and not result.ok:
            result.judged = "a clean refusal: passes"
        if row.failed:
            crash_dir = pair.crash.spec.run_dir
            facts = after_crash(row, pair.record, crash_dir, result, run, pair.point.overwrites)
            facts = dataclasses.replace(
                facts, rolled_back=tuple(pair.rolled_back or ()), completed=tuple(completed)
            )
            row.diagnosis = crash_cause(facts, row.why)

    def conclude(self, judge: Judging) -> None:
        rows = [p.row for p in self.pairs]
        failing = next((p for p in self.pairs if p.row.failed), None)
        reached = [r for r in rows if r.status != "not reached"]
        status = "failed" if failing is not None or not reached else "passed"
        judged = (failing or self.pairs[0]).row.verdict if self.pairs else None
        diagnosis = judged.diagnosis if judged is not None and failing else None
        if failing is not None and failing.row.diagnosis is not None:
            diagnosis = failing.row.diagnosis  # the crash, not one object, explains it
        verdict = Verdict(
            self.kind,
            status,
            self.label,
            self.split,
            why="" if reached else "no crash point was reached",
            comparison=judged.comparison if judged is not None and failing else None,
            diagnosis=diagnosis,
            facts=[CrashTable(self.split, rows), *(judged.facts if judged and failing else [])],
            primary=True,
            launch=(failing or self.pairs[0]).resumed.name if self.pairs else "",
        )
        verdict.runs = {"uninterrupted": self.full.spec.run_dir}
        if failing is not None:
            verdict.runs["crashed"] = failing.crash.spec.run_dir
            verdict.runs["resumed after it"] = failing.resumed.spec.run_dir
            verdict.rerun = judge.result(failing.resumed).command
            verdict.signatures = judged.signatures if judged is not None else None
        self.reach(judge, verdict)

    def final(self) -> Optional[Verdict]:
        if self.verdict is None:
            return Verdict(self.kind, "not run", self.label, self.split, primary=True)
        return self.verdict

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        table = _table(verdict)
        if table is None:
            return super().headline(verdict)
        counts: dict[str, int] = {}
        for row in table.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        said = ", ".join(f"{n} {status}" for status, n in counts.items())
        return [f"{verdict.label} {verdict.status} ({said})", *table.lines(verdict.label)[1:]]

    @classmethod
    def proved(cls, verdict: Verdict) -> str:
        if verdict.status != "passed":
            return ""
        table = _table(verdict)
        rows = table.rows if table else []
        exact = sum(r.status == EXACT for r in rows)
        refused = sum(r.status == REFUSED for r in rows)
        return f"{verdict.label}: {exact} exact, {refused} refused of {len(rows)} crash points"

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        """The table, then the first failing point: why, and its resume's own judgement."""
        table = _table(verdict)
        lines = table.lines(verdict.label) if table else [f"{verdict.label} failed"]
        if verdict.why:
            lines.append(f"  {verdict.why}")
        failing = next((r for r in table.rows if r.failed), None) if table else None
        if failing is not None:
            lines.append(f"first failing point ({failing.point}): {failing.where}: {failing.why}")
        if verdict.comparison is not None:
            rest = [f for f in verdict.facts if not isinstance(f, CrashTable)]
            lines += ResumeLike.block(dataclasses.replace(verdict, facts=rest), outcome, kept)
        elif verdict.diagnosis is not None:
            lines += format_diagnosis(verdict.diagnosis)
        for role in ("crashed", "resumed after it"):
            if verdict.runs.get(role):
                lines.append(f"  {role + ':':<17} {verdict.runs[role]}")
        return lines

    @classmethod
    def words(cls, verdict: Verdict) -> str:
        table = _table(verdict)
        failing = next((r for r in table.rows if r.failed), None) if table else None
        if failing is None:
            return f"{verdict.label}: {verdict.why}"
        return f"{verdict.label}: {failing.point}: {failing.why}"
