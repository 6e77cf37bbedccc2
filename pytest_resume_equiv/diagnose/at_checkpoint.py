"""The causes read from the checkpoint itself (`Stage.CHECKPOINT`), before any stream or
object: which checkpoint the resumed run loaded (the restore log against the saving run's file
events) and when it was written. Each of them makes every stream and object differ at once."""

from __future__ import annotations

import os
from typing import Optional

from ..rank.layout import target_file
from .classes import (
    ANOTHER_STEPS_CHECKPOINT,
    GRADIENT_ACCUMULATION,
    RESTORED_FROM_ANOTHER_STEP,
    TORN_CHECKPOINT,
)
from .evidence import LOSS_KEY, Evidence, lost_micro_batches, touches
from .rules import Finding, Rule, Stage
from .subject import equal_to_step

STAGE = (Stage.CHECKPOINT,)


def _writes(ev: Evidence) -> list[dict]:
    """Per rank whose resumed run names the checkpoint it loaded: its path and the saving
    run's file events there, split by when they happened (read from the events of the run
    that saved it, never from file times: the resumed run may write into the folder it
    loaded)."""
    saved = [ev.base_sigs[r].resume_point(ev.split) for r in sorted(ev.base_sigs)]
    if not saved or any(p is None for p in saved):
        return []
    moved_on = max(p.get("time_ns", 0) for p in saved)
    found = []
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        path = ((res or {}).get("checkpoint") or {}).get("path")
        if not path or not moved_on or not _read_under(ev, rank, os.path.realpath(path)):
            continue
        path = os.path.realpath(path)
        writes = [
            (r, e) for r, sig in sorted(ev.base_sigs.items()) for e in sig.files if touches(e, path)
        ]
        found.append(_split_writes(writes, moved_on, ev.split, (res or {}).get("time_ns")))
        found[-1].update(rank=rank, path=path, writes=writes)
    return found


def _read_under(ev: Evidence, rank: int, path: str) -> bool:
    """Whether the resumed run's restore log on `rank` loaded a file at or under `path`: a
    run given the checkpoint that never read it (it looked elsewhere, found nothing and
    started over) loaded no save of it, however often the saving run wrote it."""
    for entry in ev.restores(rank):
        what = str(entry.get("what", ""))
        if what.startswith("file ") and touches({"path": os.path.realpath(what[5:])}, path):
            return True
    return False


def _split_writes(writes: list, moved_on: int, split: int, loaded_at: Optional[int]) -> dict:
    """The writes made before the uninterrupted run moved on past the split (`on_time`); after
    it, in a background thread (`behind`) or in the training thread while the split was
    still the last step (`mid_step`); after a later step, before the resumed run loaded it
    (`again`)."""
    late = [(r, e) for r, e in writes if e.get("time_ns", 0) > moved_on]
    return {
        "on_time": [(r, e) for r, e in writes if e.get("time_ns", 0) <= moved_on],
        "behind": [(r, e) for r, e in late if e.get("thread")],
        "mid_step": [
            (r, e) for r, e in late if not e.get("thread") and e.get("after_step") == split
        ],
        "again": [
            (r, e)
            for r, e in writes
            if (e.get("after_step") or 0) > split
            and e.get("time_ns", 0) < (loaded_at or float("inf"))
        ],
    }


def _restored_step(ev: Evidence, rank: int) -> Optional[int]:
    return equal_to_step(ev, rank) or equal_to_step(ev, rank, part="state")


def _event(writer: int, event: dict) -> dict:
    op, path = event["op"], os.path.basename(event.get("path", ""))
    to = f" -> {os.path.basename(event['to'])}" if event.get("to") else ""
    return {
        "writer": writer,
        "write": f"{op}({path}{to})",
        "after_step": event.get("after_step"),
        "thread": event.get("thread"),
    }


def written_late(ev: Evidence) -> Optional[Finding]:
    """The checkpoint was not on disk when the uninterrupted run went on past the split: it
    was written later, or partly in a background thread then, after training had changed the
    tensors it holds."""
    for found in _writes(ev):
        late = [w for w in found["writes"] if w not in found["on_time"]]
        if late and late == found["mid_step"] and _mid_window(ev, found["rank"]):
            continue  # written in the training thread inside the next step's window
        if found["writes"] and (not found["on_time"] or found["behind"]):
            return _write_found(ev, found, (found["behind"] or found["writes"])[0])
    return None


def _write_found(ev: Evidence, found: dict, write: tuple, variant: str = "") -> Finding:
    """A finding about one write of the saving run (`write`: its rank and its file event) to
    the checkpoint `found` names."""
    writer, event = write
    evidence = {"path": found["path"], "split": ev.split}
    evidence["restored_step"] = _restored_step(ev, found["rank"])
    return Finding(f"rank {found['rank']}", {**evidence, **_event(writer, event)}, variant)


def _state_words(f: Finding) -> str:
    step = f["restored_step"]
    if not step:
        return ""
    state = f"; what it restored is the uninterrupted run's state after step {step}"
    if step > f["split"]:
        state += ": its contents are from a later step than it claims, a staging race"
    return state


def _late_words(f: Finding) -> str:
    thread = f" in thread {f['thread']!r}" if f["thread"] else ""
    return (
        f"the checkpoint at {f['path']} was not on disk when the uninterrupted run went on "
        f"past step {f['split']}; it was written later{thread} (rank {f['writer']}: "
        f"{f['write']} after step {f['after_step']}), after training had changed the "
        f"tensors{_state_words(f)}"
    )


def rewritten(ev: Evidence) -> Optional[Finding]:
    """The checkpoint was written again by the uninterrupted run after it saved it at the
    split, before the resumed run loaded it: a later save to the same path (a rolling path)."""
    for found in _writes(ev):
        if found["again"]:
            return _write_found(ev, found, found["again"][0], "rolling")
    return None


def _rewritten_words(f: Finding) -> str:
    return (
        f"the checkpoint at {f['path']} was written again by the uninterrupted run after it "
        f"saved it at step {f['split']} (rank {f['writer']}: {f['write']} after step "
        f"{f['after_step']}), before the resumed run loaded it: the resumed run loaded a later "
        f"save to the same path{_state_words(f)}"
    )


def saved_mid_window(ev: Evidence) -> Optional[Finding]:
    """The checkpoint was written again by the uninterrupted run after it began the step
    after the split (after that step's first forward, still counted as the split's: no
    optimizer step in between) while that step accumulates several micro-batches: it was
    saved in the middle of an accumulation window, and the gradients accumulated before the
    save are not in it. How many micro-batches the first resumed step lost is read from the
    losses of each backward (automatic recording), where they show it."""
    for found in _writes(ev):
        losses = _mid_window(ev, found["rank"])
        if not found["mid_step"] or not losses:
            continue
        writer, event = found["mid_step"][-1]
        kept = ev.res.get(found["rank"], {}).get(ev.split + 1, {}).get(LOSS_KEY)
        evidence = {"path": found["path"], "step": ev.split + 1, "micro_batches": len(losses)}
        evidence.update(lost=lost_micro_batches(losses, kept), again=bool(found["on_time"]))
        return Finding(f"rank {found['rank']}", {**evidence, **_event(writer, event)}, "window")
    return None


def _mid_window(ev: Evidence, rank: int) -> list:
    """The losses of the uninterrupted run's step after the split, one per backward, when it
    accumulated several micro-batches (a window a save can fall inside); [] otherwise."""
    losses = ev.base.get(rank, {}).get(ev.split + 1, {}).get(LOSS_KEY)
    return losses if isinstance(losses, list) and len(losses) > 1 else []


def _mid_window_words(f: Finding) -> str:
    n = f["lost"]
    lost = f" ({n} micro-batch{'es' * (n != 1)})" if n else ""
    return (
        f"the checkpoint at {f['path']} was written{' again' * f['again']} after the "
        "uninterrupted run began "
        f"step {f['step']} (rank {f['writer']}: {f['write']}, before that step's optimizer "
        f"step), in the middle of its accumulation window of {f['micro_batches']} "
        f"micro-batches: the accumulated gradients of the micro-batches before the save{lost} "
        "are not in the checkpoint and were lost at the resume"
    )


def other_step_loaded(ev: Evidence) -> Optional[Finding]:
    """The resumed run read the checkpoint of another step than the one the test gave it (the
    newest folder, a `latest` pointer that moved on, a step computed wrongly): its restore log
    read files outside the given checkpoint that the uninterrupted run wrote after another
    step, and what it restored equals that step's state (or it read nothing inside the given
    one)."""
    written: dict[str, int] = {}
    for sig in ev.base_sigs.values():
        for event in sig.files:
            for path in (event.get("path"), event.get("to")):
                if path and isinstance(event.get("after_step"), int):
                    written[os.path.realpath(path)] = event["after_step"]
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        given = ((res or {}).get("checkpoint") or {}).get("path")
        if not given:
            continue
        given = os.path.realpath(given)
        log = ev.restores(rank)[: (res or {}).get("restores", len(ev.restores(rank)))]
        elsewhere, inside = [], 0
        for entry in log:
            path = target_file(entry["what"])
            real = os.path.realpath(path) if path else None
            if real is None:
                continue
            if real == given or real.startswith(given.rstrip(os.sep) + os.sep):
                inside += 1
            elif written.get(real, ev.split) != ev.split:
                elsewhere.append((entry, real, written[real]))
        if not elsewhere:
            continue
        entry, path, step = elsewhere[-1]
        same = _restored_step(ev, rank)
        if same != step and inside:
            continue  # it read the given checkpoint too, and nothing says it used the other
        evidence = {"step": step, "split": ev.split, "read": path, "call": entry["call"]}
        evidence.update(at=entry["at"], given=given, restored_step=same)
        return Finding(f"rank {rank}", evidence)
    return None


def _other_step_words(f: Finding) -> str:
    state = (
        f"; what it restored equals the uninterrupted run's state after step {f['step']}"
        if f["restored_step"] == f["step"]
        else ""
    )
    return (
        f"loaded the checkpoint of step {f['step']}, not the one of step {f['split']}: the "
        f"restore log read {f['read']} ({f['call']} at {f['at']}), which the uninterrupted run "
        f"wrote after step {f['step']}, while the resume was pointed at {f['given']}{state}"
    )


OTHER_STEP, LATE = "checkpoint.another-steps-loaded", "checkpoint.written-late"
RULES = (
    Rule(OTHER_STEP, STAGE, ANOTHER_STEPS_CHECKPOINT, other_step_loaded, _other_step_words),
    Rule(LATE, STAGE, TORN_CHECKPOINT, written_late, _late_words, (OTHER_STEP,)),
    Rule(
        "checkpoint.rewritten",
        STAGE,
        RESTORED_FROM_ANOTHER_STEP,
        rewritten,
        _rewritten_words,
        after=(LATE,),
    ),
    Rule(
        "checkpoint.saved-mid-window",
        STAGE,
        GRADIENT_ACCUMULATION,
        saved_mid_window,
        _mid_window_words,
        after=("checkpoint.rewritten",),
    ),
)
"""A checkpoint of another step explains a late one's contents; a late write explains a
rewritten path's (the late one is the save that never finished in time)."""
