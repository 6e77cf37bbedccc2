"""Causes read at the resume point: what the checkpoint restored, compared with the
uninterrupted run at the same program point, before any resumed step has mixed the effects.

In time order: the checkpoint itself (written again after the save?), then the state right
before the first resumed step, object by object (left in the wrong mode; restored from
another rank or another step; at reduced precision; partly; not at all; restored and then
advanced by draws; re-seeded after the load), each read with the restore log. Each cause
gives its fix in one line.
"""

from __future__ import annotations

from typing import Optional

from ..rank.layout import watched, watched_part
from ..rank.restore import is_seed
from .causes import OBJECT_RULES, STREAM_RULES, stream_words
from .evidence import Diagnosis, Evidence
from .subject import equal_to_step, names, point_differences, point_value, subjects


def checkpoint_rewritten(ev: Evidence) -> Optional[Diagnosis]:
    """The checkpoint the resumed run loaded was written after the uninterrupted run had
    saved at the split and gone on: a later save to the same path (it was there when the
    uninterrupted run moved on), or a save that finished late (it was not)."""
    saved = [ev.base_sigs[r].resume_point(ev.split) for r in sorted(ev.base_sigs)]
    if not saved or any(p is None for p in saved):
        return None
    moved_on = max(p.get("time_ns", 0) for p in saved)
    there = all((p.get("checkpoint") or {}).get("files") for p in saved)
    paths = {(p.get("checkpoint") or {}).get("path") for p in saved}
    for rank in sorted(ev.res_sigs):
        _, res = ev.points(rank)
        loaded = (res or {}).get("checkpoint") or {}
        if loaded.get("path") not in paths or not loaded.get("latest_ns", 0) > moved_on > 0:
            continue
        later = equal_to_step(ev, rank)
        state = f"; what it restored is the uninterrupted run's state after step {later}"
        state = state if later else ""
        if not there:
            return Diagnosis(
                f"rank {rank}: the checkpoint at {loaded['path']} was not on disk when the "
                f"uninterrupted run went on past step {ev.split}; it was written later, after "
                f"training had changed the tensors{state}. Fix: finish the save (or copy the "
                "state it writes) before the next step: a background or asynchronous save must "
                "not read tensors the training goes on updating",
                "torn checkpoint",
            )
        return Diagnosis(
            f"rank {rank}: the checkpoint at {loaded['path']} was written again after the "
            f"uninterrupted run saved it at step {ev.split} and went on: the resumed run loaded "
            f"a later save to the same path{state}. Fix: put {{split}} in the checkpoint path "
            '(one checkpoint per split), or use interrupt="stop"',
            "restored from another step",
        )
    return None


def wrong_mode(ev: Evidence) -> Optional[Diagnosis]:
    for rank in sorted(ev.res_sigs):
        modes = [k for k in point_differences(ev, rank) if watched_part(k) == "modes"]
        if modes:
            base, res = ev.points(rank)
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
                "left in the wrong mode",
            )
    return None


def state_at_resume(ev: Evidence) -> Optional[Diagnosis]:
    """The first thing that differs at the resume point, explained by how it was restored."""
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
                return found
    return None


RESUME_RULES = (checkpoint_rewritten, wrong_mode, state_at_resume)


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
