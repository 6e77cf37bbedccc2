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
from typing import Any, Optional

from ..compare.comparators import Run
from ..errors import ResumeEquivError
from ..launch.running import LaunchResult
from ..marker import CRASH_MODES
from ..plan import PlannedLaunch, Planner
from ..rank.crasher import RETURNED
from ..rank.run_dir import crash_record_path, signature_path
from ..signature import SignatureError, count, read_signature
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
from .crash_points import (
    NAMES,
    CrashPoint,
    crashed_where,
    find_points,
    lay_out,
    on_disk,
    only_point,
    point_split,
)
from .crash_table import CATCH_ALL, CrashTable, crash_cause, table_of
from .launches import one_group, uninterrupted_of
from .power_loss import merged, roll_back, rolled_back_words, unsynced
from .preemption import Preempted, preempt_point, preempt_steps
from .resume import ResumeLike, format_diagnosis

GROUPS = (
    'interrupt="crash" needs one uninterrupted launch that saves at every split, but the '
    "command differs per split (it uses {split}); use {splits}, or ctx.should_save(step)"
)


def _untouched(point: CrashPoint) -> bool:
    """The point's save had completed and nothing wrote after it: a kill once it returned (a
    SIGTERM's handler may write in place after it, a power loss may undo it)."""
    return point.completes and point.kind == RETURNED and not point.power and not point.preempt


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
    preempted: Optional[Preempted] = None
    """A preempt point: what the SIGTERM and its grace did (`preemption.py`)."""


class Crash(Check):
    kind = "crash"

    def __init__(self, planner: Planner, full: PlannedLaunch, split: int, prefix: str) -> None:
        super().__init__([full])
        self.planner = planner
        self.full = full
        self.split = split
        self.prefix = prefix
        """How this save's launches are named: `crash` (`crash-1`, `resumed-crash-1`), or
        `crash-split2` when every save is crashed."""
        self.label = f"crash at split {self.split}"
        self.pairs: list[Pair] = []
        self.sampled = ""
        """`crash_points=N`: how many of how many, with which seed (the table says)."""

    @classmethod
    def plan(cls, planner: Planner) -> list[Check]:
        marker = planner.marker
        if marker.interrupt != "crash":
            return []
        one_group(planner, GROUPS)
        if "{run_dir}" not in planner.checkpoint:
            raise ResumeEquivError(
                f'interrupt="crash" needs checkpoint= under {{run_dir}} (got '
                f"{planner.checkpoint!r}): every crash launch tears its own copy, e.g. "
                "checkpoint='{run_dir}/checkpoints' for a trainer that finds its latest "
                "checkpoint there"
            )
        full = uninterrupted_of(planner, marker.splits[-1])
        saves = marker.splits if marker.crash_saves == "all" else marker.splits[-1:]
        only = planner.settings.crash_point
        if only is not None:
            saves = (point_split(only, marker.splits),)
        if len(saves) == 1:
            return [cls(planner, full, saves[0], "crash")]
        return [cls(planner, full, split, f"crash-split{split}") for split in saves]

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
        planner = self.planner
        points = self.points(judge.signatures(self.full))
        judge.say(f"{self.label}: {count(len(points), 'crash point')}, {2 * len(points)} launches")
        for number, point in enumerate(points, start=1):
            name = f"{self.prefix}-{number}"
            crash = planner.saving(
                name,
                "crash",
                planner.marker.splits,
                os.path.join(planner.root, name),
                planner.marker.steps,
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
            crash.judged_first = True  # its judging lays out what the restarted job finds
            row = Row(point.name, point.where(self.full.spec.run_dir), status="pending")
            row.id = point.id
            self.pairs.append(Pair(point, crash, resumed, row))
            self.launches += [crash, resumed]
            judge.start(crash)
            judge.start(resumed)

    def points(self, full: Run) -> list[CrashPoint]:
        """The save's crash points the marker asks for, or the one point
        `--resume-equiv-crash-point` names (looked for among all of them, in every mode)."""
        marker, settings = self.planner.marker, self.planner.settings
        run_dir = self.full.spec.run_dir

        seed, grace = settings.crash_seed, marker.crash_grace

        def found(choice: Any, modes: tuple[str, ...]) -> list[CrashPoint]:
            split, splits = self.split, marker.splits
            return find_points(full, split, splits, choice, run_dir, modes, seed, grace)

        if settings.crash_point is not None:
            every = found(["all", *NAMES], CRASH_MODES)
            return only_point(every, settings.crash_point, self.split)
        points = found(marker.crash_points, marker.crash_mode)
        if isinstance(marker.crash_points, int):
            every = found(["all", *NAMES], marker.crash_mode)
            of, drawn = (len({(p.kind, p.index, p.thread) for p in ps}) for ps in (every, points))
            modes = len(marker.crash_mode)
            each = f", each in {modes} modes" if modes > 1 else ""
            self.sampled = f"{drawn} of {of} sampled, seed {seed}{each}"
        return points

    def crashed(self, pair: Pair, judge: Judging) -> None:
        """The crash launch ended: where it was killed, what it left on disk."""
        run_dir = pair.crash.spec.run_dir
        record = pair.record = read_crash_record(crash_record_path(run_dir))
        result = judge.result(pair.crash)
        if record is not None:
            pair.row.where = result.crashed = crashed_where(record, run_dir)
            if pair.point.preempt is not None:
                full, splits = judge.signatures(self.full), self.planner.marker.splits
                found = preempt_point(
                    pair.point, record, result, full, self.full.spec.run_dir, splits
                )
                pair.preempted, pair.row.then = found, found.words()
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
        completed, saved = preempt_steps(pair.preempted, completed, self.split)
        refusal = self.planner.marker.crash_refusal
        full = judge.signatures(self.full)
        steps = self.planner.marker.steps
        over = pair.preempted is not None and pair.preempted.recorded_through == steps
        row = judge_after_crash(
            pair.row,
            result,
            full,
            run,
            completed,
            judge.comparator,
            refusal,
            saved,
            finished=steps if over else None,
        )
        for run_dir in (pair.crash.spec.run_dir, pair.resumed.spec.run_dir):
            row.why = row.why.replace(run_dir + os.sep, "")  # its paths, short
        if _untouched(pair.point) and row.resumed_from == self.split:  # nothing was torn
            torn = f"{TORN} of step {self.split}: "
            complete = f"resumed from the complete checkpoint of step {self.split}, yet "
            row.why = row.why.replace(torn, complete)
        if row.status == REFUSED and not result.ok:
            result.judged = "a clean refusal: passes"
        if row.failed:
            crash_dir = pair.crash.spec.run_dir
            facts = after_crash(row, pair.record, crash_dir, result, run, pair.point.overwrites)
            facts = dataclasses.replace(
                facts, rolled_back=tuple(pair.rolled_back or ()), completed=tuple(completed)
            )
            if pair.preempted is not None:  # the SIGTERM's event is no kill's
                facts = dataclasses.replace(facts, preempted=pair.preempted.facts(), killed_at=None)
            row.diagnosis = crash_cause(facts, row.why)

    def not_the_crash(self) -> Optional[Pair]:
        """A point where the save had completed (it returned, nothing of it in the
        background) whose resume, from that complete checkpoint, failed all the same: what
        fails there is the trainer's own resume, not what a crash left, and no point's
        failure can be put down to a torn checkpoint by default."""
        return next(
            (
                p
                for p in self.pairs
                if _untouched(p.point) and p.row.failed and p.row.resumed_from == self.split
            ),
            None,
        )

    def conclude(self, judge: Judging) -> None:
        rows = [p.row for p in self.pairs]
        failing = next((p for p in self.pairs if p.row.failed), None)
        reached = [r for r in rows if r.status != "not reached"]
        status = "failed" if failing is not None or not reached else "passed"
        why = "" if reached else "no crash point was reached"
        own = self.not_the_crash()
        if own is not None:
            failing = own
            for pair in self.pairs:
                found = pair.row.diagnosis
                if found is not None and found.rule == CATCH_ALL:
                    pair.row.diagnosis = None  # no torn checkpoint explains the one complete
            why = (
                f"the resume from the complete checkpoint of step {self.split} (point "
                f"'{own.row.point}': its save had returned) fails too: what differs is the "
                "trainer's own resume, not what the crash left; the cause below is that "
                'resume\'s (a test with interrupt="continue" shows it alone)'
            )
        judged = (failing or self.pairs[0]).row.verdict if self.pairs else None
        diagnosis = judged.diagnosis if judged is not None and failing else None
        if failing is not None and failing.row.diagnosis is not None:
            diagnosis = failing.row.diagnosis  # the crash, not one object, explains it
        verdict = Verdict(
            self.kind,
            status,
            self.label,
            self.split,
            why=why,
            comparison=judged.comparison if judged is not None and failing else None,
            diagnosis=diagnosis,
            facts=[self.table(rows), *(judged.facts if judged and failing else [])],
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

    def table(self, rows: list[Row]) -> CrashTable:
        device = self.planner.device.kind  # the device it ran on, whatever the option said
        return CrashTable(self.split, rows, self.sampled, f"--resume-equiv-device={device}")

    def final(self) -> Optional[Verdict]:
        if self.verdict is None:
            return Verdict(self.kind, "not run", self.label, self.split, primary=True)
        return self.verdict

    @classmethod
    def headline(cls, verdict: Verdict) -> list[str]:
        table = table_of(verdict)
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
        table = table_of(verdict)
        rows = table.rows if table else []
        exact = sum(r.status == EXACT for r in rows)
        refused = sum(r.status == REFUSED for r in rows)
        sampled = f" ({table.sampled})" if table is not None and table.sampled else ""
        points = f"{count(len(rows), 'crash point')}{sampled}"
        return f"{verdict.label}: {exact} exact, {refused} refused of {points}"

    @classmethod
    def block(cls, verdict: Verdict, outcome: Outcome, kept: str) -> list[str]:
        """The table, then the first failing point: why, and its resume's own judgement."""
        table = table_of(verdict)
        lines = table.lines(verdict.label) if table else [f"{verdict.label} failed"]
        failing = next((r for r in table.rows if r.failed), None) if table else None
        if failing is not None:
            lines.append(f"first failing point ({failing.point}): {failing.where}: {failing.why}")
            if failing.id and outcome.test_id:
                lines.append(
                    f"  rerun this point alone: pytest '{outcome.test_id}' -p resume_equiv "
                    f"{table.rerun_args} --resume-equiv-crash-point={failing.id}"
                )
        if verdict.why:
            lines.append(f"  {verdict.why}")
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
        table = table_of(verdict)
        failing = next((r for r in table.rows if r.failed), None) if table else None
        if failing is None:
            return f"{verdict.label}: {verdict.why}"
        return f"{verdict.label}: {failing.point}: {failing.why}"
