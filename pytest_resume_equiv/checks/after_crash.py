"""What the resumed run did after one crash, judged: pure, so each outcome is unit-tested
with synthetic signatures.

A trainer may resume from the newest checkpoint that had completed before the crash, or from
the torn save's own checkpoint when it turns out complete and exact; with none completed it may
refuse (a deliberate exit) or start over. Anything else fails: it crashed or hung on the torn
checkpoint, it loaded a torn or mixed one (the state after loading is not the uninterrupted
run's at that step), it lost a completed checkpoint, or it diverged afterwards.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ..compare.comparators import Comparator, Run
from ..compare.gate import GateFacts
from ..compare.jsonable import NOT_IN_JSON
from ..compare.loaded_step import loaded_step
from ..diagnose import Diagnosis
from ..diagnose.at_crash import WRITE_CALLS, AfterCrash, saving_words, short
from ..launch.rank_exits import failed_first
from ..launch.running import LaunchResult
from ..rank.crasher import relative
from ..rank.run_dir import RankStatus, read_status, user_files
from .base import Verdict
from .resume import judge_resume

EXACT, REFUSED, FAILED, NOT_REACHED = "exact", "refused", "failed", "not reached"
TORN = "resumed from a torn or mixed checkpoint"
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python\d|pytest_resume_equiv)")


@dataclass
class Row:
    """One crash point of the table."""

    point: str
    where: str
    """The event the crash launch was killed at (its crash record), or the planned one."""
    disk: str = ""
    resumed_from: Optional[int] = None
    status: str = NOT_REACHED
    why: str = ""
    rolled_back: str = ""
    """A power-loss point: the writes not yet durable that were undone, in words."""
    id: str = ""
    """The point's id (`CrashPoint.id`), which `--resume-equiv-crash-point` reruns alone."""
    then: str = ""
    """A preempt point: what the ranks did after the SIGTERM, in words."""
    verdict: Optional[Verdict] = field(default=None, compare=False, metadata=NOT_IN_JSON)
    """The resume's own judgement, when one was compared."""
    diagnosis: Optional[Diagnosis] = field(default=None, compare=False, metadata=NOT_IN_JSON)
    """The cause read from what the crash left and what the resume did (diagnose/at_crash)."""

    @property
    def failed(self) -> bool:
        return self.status == FAILED


def refused_deliberately(run_dir: str, world_size: int) -> str:
    """A rank's own refusal (a non-zero `sys.exit`, or an exception raised in the trainer's
    code, not in a library it called), in its words; "" when every failure came from inside a
    library (a crash on the torn checkpoint)."""
    for rank in range(world_size):
        status = read_status(run_dir, rank)
        if status is None:
            continue
        if status.status == "exit":
            return f"rank {rank}: {one_line(status.message) or f'exit code {status.code}'}"
        frames = re.findall(r'File "([^"]+)", line \d+', status.traceback)
        if status.status == "error" and frames and not LIBRARY.search(frames[-1]):
            return f"rank {rank}: {one_line(status.message)}"
    return ""


def _crash_text(result: LaunchResult) -> str:
    failed = failed_first(result.ranks)
    first = failed[0] if failed else None
    if first is None:
        return result.status
    return f"rank {first.rank}: {short(one_line(first.detail))}"


def one_line(message: str, limit: int = 300) -> str:
    """A message for one row of the table: an exception whose text holds other tracebacks
    (DCP's CheckpointException gathers every rank's) reads as its first line and the last
    error named in it; the whole is in the resumed run's logs/."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    errors = [line for line in lines[1:] if ERROR_LINE.match(line)]
    text = lines[0] + (f" ... {errors[-1]}" if errors else " ..." if len(lines) > 1 else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def judge_after_crash(
    row: Row,
    result: LaunchResult,
    reference: Run,
    run: Optional[Run],
    completed: list[int],
    comparator: Comparator,
    refusal: str,
    saved: tuple[int, ...] = (),
    finished: Optional[int] = None,
) -> Row:
    """`row` with what the resumed launch did (`run`: its signatures, None if unreadable),
    given the checkpoints that had completed before the crash (`completed`, ascending), the
    steps a preempted launch's SIGTERM handler may have saved besides the splits (`saved`)
    and the last step, when the preempted launch had recorded it on every rank before it
    ended (`finished`: the run was over)."""
    newest = completed[-1] if completed else None
    lost = f"lost the completed checkpoint of step {newest}" if newest else ""
    if result.timed_out:
        return _set(row, FAILED, f"hung on the torn checkpoint ({_crash_text(result)})")
    if not result.ok:
        saving = could_not_save(result.spec.run_dir, result.spec.world_size, run)
        if saving:
            return _set(row, FAILED, saving)
        refused = refused_deliberately(result.spec.run_dir, result.spec.world_size)
        empty = read_empty(result.spec.run_dir, result.spec.world_size)
        if empty and (newest or not refused):  # no refusal, when a checkpoint was there
            return _set(row, FAILED, f"crashed on the empty {empty} ({_crash_text(result)})")
        if not refused:
            return _set(row, FAILED, f"crashed on the torn checkpoint ({_crash_text(result)})")
        if newest:
            return _set(row, FAILED, f"refused ({refused}): {lost}")
        return _refused(row, f"refused ({refused})", refusal)
    firsts = {rank: sig.steps[0][0] for rank, sig in (run or {}).items() if sig.steps}
    if not firsts and finished is not None and finished in completed:
        return _nothing_left(row, reference, run, finished)
    if not firsts:
        return _set(row, FAILED, "recorded no step after the crash")
    if len(set(firsts.values())) > 1:
        where = ", ".join(f"rank {r} from step {s - 1}" for r, s in sorted(firsts.items()))
        return _set(row, FAILED, f"its ranks resumed from different steps ({where})")
    start = min(firsts.values()) - 1
    row.resumed_from = start
    assert run is not None
    splits = reference[min(reference)].header.get("splits") or []
    if start and start not in (*splits, *saved):
        return _set(row, FAILED, f"resumed from step {start}, where no checkpoint was saved")
    if newest and start < newest:
        over = "started over from step 0" if start == 0 else f"resumed from step {start}"
        return _set(row, FAILED, f"{over}: {lost}")
    if start == 0:
        cmp = comparator.compare(reference, run, 0)
        if not cmp.equal:
            row.verdict = Verdict("crash", "failed", row.point, 0, comparison=cmp)
            return _set(
                row, FAILED, "started over from step 0, and differs from the uninterrupted run"
            )
        return _refused(row, "started over from step 0", refusal)
    return _judged(row, reference, run, start, comparator)


def _nothing_left(row: Row, reference: Run, run: Optional[Run], last: int) -> Row:
    """A preempted launch that had finished (it recorded its `last` step on every rank and
    a checkpoint of it completed) before its SIGTERM took effect, and a restarted job that
    ran cleanly and recorded no step: right, unless what it loaded says it is of an earlier
    step (the step counters its load restored, rank/auto.py), which it then did not train."""
    row.resumed_from = last
    found = loaded_step(reference, run, last) if run else None
    if found is not None:
        steps = sorted(set(found.found.values()))
        of = f"of step {', '.join(map(str, steps))}" if steps else "of another step"
        ranks = ", ".join(f"rank {r}" for r in sorted({*found.counters, *found.files}, key=int))
        return _set(
            row,
            FAILED,
            f"recorded no step after the crash: the run had finished before the SIGTERM took "
            f"effect (its save holds step {last}), but the checkpoint the restarted job loaded "
            f"is {of} ({ranks}), and it trained none of the steps after it",
        )
    return _set(
        row,
        EXACT,
        f"exact (the run had finished before the SIGTERM took effect: its save holds step "
        f"{last}, nothing left to resume)",
    )


def _judged(row: Row, reference: Run, run: Run, start: int, comparator: Comparator) -> Row:
    """A resume from `start`: exact from there on, the state after loading included."""
    for sig in run.values():  # the snapshot the trainer took at its resume point
        for point in sig.resume_points[:1]:
            point["split"] = start
    verdict = judge_resume(reference, run, start, comparator, "crash", f"split {start}")
    row.verdict = verdict
    if verdict.status == "passed":
        return _set(row, EXACT, f"exact (resumed from step {start})")
    # the gate-held finding (the state after loading differs); a loaded-step finding cannot
    # be one here, the start being the step the load restored
    held = next((f for f in verdict.facts if isinstance(f, GateFacts)), None)
    if held is not None and held.failed:
        return _set(
            row,
            FAILED,
            f"{TORN} of step {start}: the state after loading "
            f"differs from the uninterrupted run's at step {start} ({_differing(held)})",
        )
    return _set(
        row, FAILED, f"resumed from step {start}, then diverged ({verdict.first_difference()})"
    )


def _differing(held: GateFacts) -> str:
    return "; ".join(
        f"rank {rank}: {', '.join(keys[:4])}" for rank, keys in sorted(held.differing.items())
    )


def _refused(row: Row, why: str, refusal: str) -> Row:
    if refusal == "fail":
        return _set(row, FAILED, f'{why}, and crash_refusal="fail"')
    return _set(row, REFUSED, why)


def _set(row: Row, status: str, why: str) -> Row:
    row.status, row.why = status, why
    return row


def _start(run: Optional[Run]) -> Optional[int]:
    """The step a resumed run started after (its first recorded step, less one)."""
    firsts = [sig.steps[0][0] for sig in (run or {}).values() if sig.steps]
    return min(firsts) - 1 if firsts else None


def failing_rank(run_dir: str, world_size: int) -> Optional[tuple[int, RankStatus]]:
    """The first rank whose exception came out of a watched call (`RankStatus.call`), else
    the first that raised, with its status."""
    statuses = [(r, read_status(run_dir, r)) for r in range(world_size)]
    raised = [(r, s) for r, s in statuses if s is not None and s.status == "error"]
    return next((item for item in raised if item[1].call), raised[0] if raised else None)


def read_empty(run_dir: str, world_size: int) -> str:
    """The file the failed rank read last, when it is empty and its error came from no
    call on another file: "checkpoints/step" (a marker opened, not yet written); "" else."""
    found = failing_rank(run_dir, world_size)
    if found is None or not found[1].read:
        return ""
    last, call = found[1].read[-1], found[1].call or {}
    if call.get("path") and call.get("path") != last:
        return ""
    try:
        empty = os.path.isfile(last) and os.path.getsize(last) == 0
    except OSError:
        return ""
    return relative(last, run_dir) if empty else ""


def _saving_call(status: RankStatus, start: Optional[int]) -> bool:
    call = status.call or {}
    if call.get("op") not in WRITE_CALLS or call.get("after_step") is None:
        return False
    if call.get("op") == "open" and not set("wax+") & set(str(call.get("mode", "r"))):
        return False
    return start is None or int(call["after_step"]) > start


def could_not_save(run_dir: str, world_size: int, run: Optional[Run]) -> str:
    """A resumed run that trained, then failed in a write call of its own save: "the
    restarted job could not save step 4: os.replace onto the existing checkpoints/step_4:
    Directory not empty"; "" otherwise."""
    found = failing_rank(run_dir, world_size)
    if found is None or not _saving_call(found[1], _start(run)):
        return ""
    call = relative_call(found[1].call or {}, run_dir)
    return f"the restarted job could not save step {call['after_step']}: {saving_words(call)}"


def relative_call(call: dict[str, Any], *run_dirs: str) -> dict[str, Any]:
    """A failed call with its paths as the report shows them."""
    shown = dict(call)
    for key in ("path", "to"):
        path = str(shown.get(key) or "")
        inside = [relative(path, d) for d in run_dirs if path]
        shown[key] = next((p for p in inside if not os.path.isabs(p)), path) if path else None
        if shown[key] is None:
            del shown[key]
    return shown


def after_crash(
    row: Row,
    record: Optional[dict[str, Any]],
    crash_dir: str,
    result: LaunchResult,
    run: Optional[Run],
    overwrites: Optional[int],
) -> AfterCrash:
    """The facts of one failed crash point for `Stage.CRASH`: the event the kill came at and
    the file it cut (from the crash record of the launch run in `crash_dir`; `overwrites`
    from the point), what the crash left (empty files too), and the resumed launch's failing
    rank's call, reads and error."""
    torn = dict((record or {}).get("torn") or {})
    if torn:
        event = (record or {}).get("event") or {}
        torn = {**torn, "op": event.get("op", "?"), "overwrites": overwrites}
        torn["path"] = relative(str(torn.get("path", "")), crash_dir)
    found = failing_rank(result.spec.run_dir, result.spec.world_size)
    failed, read, message = None, (), ""
    if found is not None:
        rank, status = found
        dirs = (result.spec.run_dir, crash_dir)
        failed = {**relative_call(status.call, *dirs), "rank": rank} if status.call else None
        read = tuple(relative_call({"path": p}, *dirs)["path"] for p in status.read)
        message = one_line(status.message)
    files = user_files(crash_dir)
    left = tuple(path for path, _ in files)
    event = (record or {}).get("event") or None
    killed_at = {**relative_call(event, crash_dir), "overwrites": overwrites} if event else None
    return AfterCrash(
        row.point,
        row.where,
        torn or None,
        failed,
        read,
        message,
        _start(run),
        left,
        killed_at=killed_at,
        empty=tuple(path for path, size in files if size == 0),
        outcome=row.why,
    )


def read_crash_record(path: str) -> Optional[dict[str, Any]]:
    """The crash launch's record of where it was killed (JSON only), None without one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


__all__ = [
    "Row",
    "after_crash",
    "could_not_save",
    "judge_after_crash",
    "read_crash_record",
    "read_empty",
]
