"""Causes read at the resume point: what the checkpoint restored, compared with the
uninterrupted run at the same program point, before any resumed step has mixed the effects.

The train/eval flags over every rank first (`Stage.RESUME_POINT`: a flag that stops dropout
also changes a stream's state), then each thing that differs (`subjects`), asked of the stream
or object rules; a cause said of every rank where the same finding holds."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import watched, watched_part
from ..rank.restore import is_seed
from .classes import LEFT_IN_THE_WRONG_MODE
from .evidence import Evidence
from .rules import Diagnosis, Finding, Rule, Stage, first
from .stream_words import stream_words
from .subject import names, point_differences, point_value, same_place, subjects


def wrong_mode(ev: Evidence) -> Optional[Finding]:
    """Train/eval flags that differ at the resume point, when both snapshots were taken at
    the same program point (an eval's forward is in eval mode)."""
    for rank in sorted(ev.res_sigs):
        modes = [k for k in point_differences(ev, rank) if watched_part(k) == "modes"]
        if not modes:
            continue
        base, res = ev.points(rank)
        if not same_place(base, res):
            continue
        a, b = point_value(base, modes[0]) or [], point_value(res, modes[0]) or []
        order = {"key": lambda n: (n != "<root>", n)}
        only_res, only_base = sorted(set(b) - set(a), **order), sorted(set(a) - set(b), **order)
        return Finding(
            f"rank {rank}",
            {
                "object": watched(modes[0])[0],
                "modules": only_res or only_base,
                "run": "resumed" if only_res else "uninterrupted",
            },
        )
    return None


def _mode_words(f: Finding) -> str:
    return (
        f"at the resume point (before the first resumed step) the train/eval flags of "
        f"{f['object']} differ: {', '.join(f['modules'])} in eval mode in the {f['run']} run only"
    )


RULES = (
    Rule(
        "resume.train-eval-flags",
        (Stage.RESUME_POINT,),
        LEFT_IN_THE_WRONG_MODE,
        wrong_mode,
        _mode_words,
    ),
)


def state_at_resume(ev: Evidence, streams: list[Rule], objects: list[Rule]) -> Optional[Diagnosis]:
    """The first thing that differs at the resume point, explained by the first of its rules
    that finds something (`streams` or `objects`, ordered); said of every rank where the same
    rule finds the same (`ranks 0-1`), not of the first rank alone."""
    found_on: list[tuple[int, Diagnosis]] = []
    for rank in sorted(ev.res_sigs):
        found_here = subjects(ev, rank)
        for subject in found_here:
            found = first(streams if subject.is_stream else objects, subject)
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
        r for r, d in found_on[1:] if d.rule == found.rule and d.cause == f"rank {r}:{body}"
    ]
    if len(same) > 1:
        found.cause = ranks_words(same, sorted(ev.res_sigs)) + ":" + body
        found.evidence["where"] = ranks_words(same, sorted(ev.res_sigs))
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


def drawn_before_restore(ev: Evidence) -> str:
    """A stream drawn from before it was restored. Whether that draw made the data order is
    not known (a correct trainer can draw there too), so it is a lead, not a cause."""
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
