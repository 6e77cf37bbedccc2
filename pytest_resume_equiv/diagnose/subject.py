"""What differs at the resume point, one subject at a time (a random stream, or a watched
object), with what the restore log says about it: the input of the causes in causes.py."""

from __future__ import annotations

from typing import Any, Optional

from ..compare.restore_history import restore_history
from ..compare.tolerance import latent
from ..rank.layout import (
    RNG,
    WATCH,
    audit_key,
    parent_stream,
    section_names,
    section_of,
    split_key,
    subject_of,
    target_covers,
    watched,
)
from ..rank.loader import SECTIONS as LOADER_SECTIONS
from .evidence import Evidence


def point_value(point: Optional[dict], key: str) -> Any:
    """The value of an audit key in a resume-point snapshot (None where it has none)."""
    section, name = split_key(key)
    return (point or {}).get(section, {}).get(name)


def point_keys(point: Optional[dict], section: str) -> list[str]:
    """The audit keys of one section of a resume-point snapshot."""
    return [audit_key(section, name) for name in (point or {}).get(section, {})]


def point_differences(ev: Evidence, rank: int) -> list[str]:
    """Audit keys (`rng:...`, `watch:...`) that differ between the two runs' resume points."""
    base, res = ev.points(rank)
    if base is None or res is None:
        return []
    keys = []
    for section in section_names():
        a, b = base.get(section, {}), res.get(section, {})
        keys += [audit_key(section, k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return keys


def same_place(base: Optional[dict], res: Optional[dict]) -> bool:
    """Whether two resume-point snapshots were taken at the same program point (the same
    `resume_point()` line, or the first forward at the same line): only then do their train/
    eval flags say anything about the restore (an eval's forward is in eval mode)."""
    return base is not None and res is not None and base.get("at") == res.get("at")


def held_at_resume(ev: Evidence) -> bool:
    """Whether every rank's resume point matched bit for bit (the gate held): both runs took
    their snapshot at the same place and every audited value there is equal. Then no later
    difference can be blamed on how an audited object was saved or restored. (Inputs that
    differ at the first resumed step are no exact resume either: the held rules read them
    first, `consumed_data`, so they are never "computed differently".)"""
    if not ev.res_sigs:
        return False
    for rank in ev.res_sigs:
        base, res = ev.points(rank)
        if not same_place(base, res) or point_differences(ev, rank):
            return False
    return True


class Subject:
    """One thing that differs at the resume point: a random stream, or a watched object with
    the sections of it that differ; and what the restore log says about it."""

    def __init__(self, ev: Evidence, rank: int, name: str, keys: list[str]) -> None:
        self.ev, self.rank, self.name, self.keys = ev, rank, name, keys
        self.base, self.res = ev.points(rank)
        history = restore_history(ev.restores(rank), self.res)
        mine = history.of(name)
        self.restores = [history.log[i] for i in mine.restoring]
        """Calls that restored it: a seeding counts only after the checkpoint was read."""
        self.last_restore = mine.restoring[-1] if mine.restoring else -1
        """Its last restore's place in the log (a draw remembers how many restores came
        before it)."""
        self.reseeds = [history.log[i] for i in mine.reseeds]
        self.before_resume = [history.log[i] for i in mine.before_resume]
        self.in_place = history.in_place
        """DCP's load writes into tensors in place: a module may be restored unlogged."""

    @property
    def is_stream(self) -> bool:
        return section_of(self.name) == RNG

    @property
    def label(self) -> str:
        """Its name without the section: the watched object's (`model`), or the stream's."""
        return split_key(self.name)[1]

    @property
    def kind(self) -> str:
        sections = {
            part
            for obj, part in map(watched, point_keys(self.res, WATCH))
            if obj == self.label and not self.is_stream
        }
        if {"lr", "state"} <= sections:
            return "optimizer"
        if "last_epoch" in sections:
            return "scheduler"
        if "params" in sections:
            return "module"
        if sections and sections <= set(LOADER_SECTIONS):
            return "loader"
        return "object"

    def where(self) -> str:
        return f"rank {self.rank}"


def names(what: str, name: str) -> bool:
    """Whether a restore-log entry (`what`) restored `name` (`rng:cuda:*` is every cuda device)."""
    return target_covers(what, name)


def subjects(ev: Evidence, rank: int) -> list[Subject]:
    """What differs at the resume point on `rank`: data loaders first, then streams, modules,
    schedulers, optimizers, other objects."""
    grouped: dict[str, list[str]] = {}
    for key in point_differences(ev, rank):
        grouped.setdefault(subject_of(key), []).append(key)
    found = [Subject(ev, rank, name, keys) for name, keys in grouped.items()]
    # a data loader's epoch and position decide how its sampler seeds and draws: it explains
    # a sampler generator's state, not the other way round; a scheduler sets its optimizer's
    # learning rate: it explains an optimizer's lr
    # a stream re-derived from another (a sampler's generator, from the CPU RNG) after it
    order = {"loader": 0, "module": 2, "scheduler": 3, "optimizer": 4, "object": 5}
    # a stream no compared step draws from (a loader's seed drawn from a restored CPU RNG)
    # changed nothing compared: a latent difference is a warning, and never leads a cause
    return sorted(
        found,
        key=lambda s: (
            s.is_stream
            and all(
                latent(k, ev.base.get(rank, {}), ev.res.get(rank, {}), ev.split) for k in s.keys
            ),
            1 if s.is_stream else order[s.kind],
            s.is_stream and parent_stream(s.name) is not None,
            s.name,
        ),
    )


def equal_to_step(ev: Evidence, rank: int, label: str = "", part: str = "params") -> Optional[int]:
    """The other uninterrupted step whose end-of-step `part` (of the watched object `label`,
    any by default) the resume point equals (None when the split's own are the same: no step
    to tell apart). Like with like: only where the uninterrupted run's own snapshot at the
    split equals what it recorded at the end of that step, if it took one."""
    base, res = ev.points(rank)
    for key in point_keys(res, WATCH):
        obj, found_part = watched(key)
        if found_part != part or (label and obj != label):
            continue
        steps = ev.base.get(rank, {})
        own = steps.get(ev.split, {}).get(key)
        if base is not None and point_value(base, key) not in (None, own):
            continue  # the end of a step is not the program point of the snapshot
        for step, values in sorted(steps.items()):
            if step != ev.split and values.get(key) == point_value(res, key) != own:
                return step
    return None
