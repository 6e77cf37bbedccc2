"""Causes read at the resume point: what the checkpoint restored, compared with the
uninterrupted run at the same program point, before any resumed step has mixed the effects.

In time order: the checkpoint itself (another step's loaded? written again after the
save?), then the state right
before the first resumed step, object by object (left in the wrong mode; restored from
another rank or another step; at reduced precision; partly; not at all; restored and then
advanced by draws; re-seeded after the load), each read with the restore log. Each cause
gives its fix in one line.
"""

from __future__ import annotations

import os
from typing import Optional

from ..rank.layout import target_file, watched, watched_part
from ..rank.restore import is_seed
from .causes import OBJECT_RULES, STREAM_RULES, stream_words
from .classes import (
    ANOTHER_STEPS_CHECKPOINT,
    LEFT_IN_THE_WRONG_MODE,
    RESTORED_FROM_ANOTHER_STEP,
    TORN_CHECKPOINT,
)
from .evidence import Diagnosis, Evidence, touches
from .subject import (
    equal_to_step,
    names,
    point_differences,
    point_value,
    same_place,
    subjects,
)


def checkpoint_rewritten(ev: Evidence) -> Optional[Diagnosis]:
    """The checkpoint the resumed run loaded, read from the file events of the run that saved
    it (never from file times: the resumed run may write into the folder it loaded): first
    written only after the uninterrupted run had gone on past the split, or partly in a
    background thread then (a late save: torn), or written again by a later save before the
    resumed run read it (a rolling path)."""
    saved = [ev.base_sigs[r].resume_point(ev.split) for r in sorted(ev.base_sigs)]
    if not saved or any(p is None for p in saved):
        return None
    moved_on = max(p.get("time_ns", 0) for p in saved)
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        path = ((res or {}).get("checkpoint") or {}).get("path")
        if not path or not moved_on:
            continue
        path = os.path.realpath(path)
        writes = [
            (r, e) for r, sig in sorted(ev.base_sigs.items()) for e in sig.files if touches(e, path)
        ]
        loaded_by = (res or {}).get("time_ns") or float("inf")
        on_time = [(r, e) for r, e in writes if e.get("time_ns", 0) <= moved_on]
        behind = [(r, e) for r, e in writes if e.get("time_ns", 0) > moved_on and e.get("thread")]
        again = [(r, e) for r, e in writes if (e.get("after_step") or 0) > ev.split]
        again = [(r, e) for r, e in again if e.get("time_ns", 0) < loaded_by]
        step = equal_to_step(ev, rank) or equal_to_step(ev, rank, part="state")
        state = f"; what it restored is the uninterrupted run's state after step {step}"
        if step and step > ev.split:
            state += ": its contents are from a later step than it claims, a staging race"
        state = state if step else ""
        if writes and (not on_time or behind):
            writer, event = (behind or writes)[0]
            thread = f" in thread {event['thread']!r}" if event.get("thread") else ""
            return Diagnosis(
                f"rank {rank}: the checkpoint at {path} was not on disk when the uninterrupted "
                f"run went on past step {ev.split}; it was written later{thread} (rank {writer}: "
                f"{_event_words(event)} after step {event.get('after_step')}), after training "
                f"had changed the tensors{state}. Fix: finish the save (or copy the state it "
                "writes) before the next step: a background or asynchronous save must not read "
                "tensors the training goes on updating",
                TORN_CHECKPOINT,
            )
        if again:
            writer, event = again[0]
            return Diagnosis(
                f"rank {rank}: the checkpoint at {path} was written again by the uninterrupted "
                f"run after it saved it at step {ev.split} (rank {writer}: {_event_words(event)} "
                f"after step {event['after_step']}), before the resumed run loaded it: the "
                f"resumed run loaded a later save to the same path{state}. Fix: put {{split}} in "
                'the checkpoint path (one checkpoint per split), or use interrupt="stop"',
                RESTORED_FROM_ANOTHER_STEP,
            )
    return None


def other_checkpoint(ev: Evidence) -> Optional[Diagnosis]:
    """The resumed run read the checkpoint of another step than the one the test gave it (the
    newest folder, a `latest` pointer that moved on, a step computed wrongly): its restore log
    read files outside the given checkpoint that the uninterrupted run wrote after another
    step, and what it restored equals that step's state. Before every rule about a stream or
    an object: each of them differs only because all of them came from another step."""
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
        same = equal_to_step(ev, rank) or equal_to_step(ev, rank, part="state")
        if same != step and inside:
            continue  # it read the given checkpoint too, and nothing says it used the other
        state = (
            f"; what it restored equals the uninterrupted run's state after step {same}"
            if same == step
            else ""
        )
        return Diagnosis(
            f"rank {rank}: loaded the checkpoint of step {step}, not the one of step {ev.split}: "
            f"the restore log read {path} ({entry['call']} at {entry['at']}), which the "
            f"uninterrupted run wrote after step {step}, while the resume was pointed at "
            f"{given}{state}. Fix: load the checkpoint the resume was pointed at ({given}); a "
            "newest folder or a `latest` pointer moves on as later checkpoints are written",
            ANOTHER_STEPS_CHECKPOINT,
        )
    return None


def _event_words(event: dict) -> str:
    op, path = event["op"], os.path.basename(event.get("path", ""))
    to = f" -> {os.path.basename(event['to'])}" if event.get("to") else ""
    return f"{op}({path}{to})"


def wrong_mode(ev: Evidence) -> Optional[Diagnosis]:
    for rank in sorted(ev.res_sigs):
        modes = [k for k in point_differences(ev, rank) if watched_part(k) == "modes"]
        if modes:
            base, res = ev.points(rank)
            if not same_place(base, res):
                continue
            a, b = point_value(base, modes[0]) or [], point_value(res, modes[0]) or []
            order = {"key": lambda n: (n != "<root>", n)}
            only_res, only_base = sorted(set(b) - set(a), **order), sorted(set(a) - set(b), **order)
            run = "resumed" if only_res else "uninterrupted"
            return Diagnosis(
                f"rank {rank}: at the resume point (before the first resumed step) the train/"
                f"eval flags of {watched(modes[0])[0]} differ: {', '.join(only_res or only_base)} in "
                f"eval mode in the {run} run only. Fix: give every module the mode the "
                "uninterrupted run has there (model.train() after loading, or save and restore "
                "the flags the training changes)",
                LEFT_IN_THE_WRONG_MODE,
            )
    return None


def state_at_resume(ev: Evidence) -> Optional[Diagnosis]:
    """The first thing that differs at the resume point, explained by how it was restored;
    said of every rank where the same explanation holds word for word (`ranks 0-1`), not of
    the first rank alone."""
    found_on: list[tuple[int, Diagnosis]] = []
    for rank in sorted(ev.res_sigs):
        found_here = subjects(ev, rank)
        for subject in found_here:
            rules = STREAM_RULES if subject.is_stream else OBJECT_RULES
            found = next((d for d in (rule(subject) for rule in rules) if d is not None), None)
            if found is not None:
                others = [s.name for s in found_here if s is not subject]
                if others:
                    found.notes.append(
                        f"also different at the resume point on rank {rank}: "
                        + ", ".join(others[:6])
                    )
                found_on.append((rank, found))
                break
    if not found_on:
        return None
    rank, found = found_on[0]
    prefix = f"rank {rank}:"
    if not found.cause.startswith(prefix):
        return found
    body = found.cause[len(prefix) :]
    same = [rank] + [
        r
        for r, d in found_on[1:]
        if d.bug_class == found.bug_class and d.cause == f"rank {r}:{body}"
    ]
    if len(same) > 1:
        found.cause = ranks_words(same, sorted(ev.res_sigs)) + ":" + body
    return found


def ranks_words(ranks: list[int], every: list[int]) -> str:
    """`ranks 0-1, 3`; `every rank` when that is all of more than two."""
    if ranks == every and len(every) > 2:
        return "every rank"
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][-1] + 1:
            spans[-1].append(r)
        else:
            spans.append([r])
    return "ranks " + ", ".join(
        f"{span[0]}-{span[-1]}" if len(span) > 1 else str(span[0]) for span in spans
    )


RESUME_RULES = (other_checkpoint, checkpoint_rewritten, wrong_mode, state_at_resume)


def drawn_before_restore(ev: Evidence) -> str:
    """A note for a data-order difference: a stream was drawn from before it was restored.
    Whether that draw made the data order is not known (a correct trainer can draw there too),
    so it is a lead, not a cause."""
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        if res is None:
            continue
        for index, entry in enumerate(ev.restores(rank)[: res.get("restores", 0)]):
            early = [
                d
                for d in res.get("draws", [])
                if names(entry["what"], d.get("stream", ""))
                and d["after_restores"] <= index
                and not is_seed(entry["call"])
            ]
            if early:
                d = early[0]
                return (
                    f"rank {rank}: {stream_words(entry['what'])} was drawn from ({d['op']} at "
                    f"{d['at']}) before it was restored ({entry['call']} at {entry['at']}); if "
                    "the data order comes from that stream, restore it before that code runs"
                )
    return ""
