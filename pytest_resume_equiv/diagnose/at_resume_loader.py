"""A data loader that differs at the resume point (`Stage.OBJECT`): which of its parts (its
epoch, its position, its shuffling generator, its workers, its dataset), each with its fix."""

from __future__ import annotations

from typing import Optional

from ..rank.layout import watch_key, watched_part
from ..signature import readable
from .classes import DATA_LOADER_STATE
from .evidence import first_diff_name
from .rules import Finding, Rule, Stage
from .subject import Subject, point_value

LOADER_PARTS = {
    "epoch": (
        "its epoch",
        "restore the sampler's epoch (set_epoch(saved_epoch) on the loader made after the "
        "load, before iterating)",
    ),
    "position": (
        "its position in the epoch",
        "restore the position (StatefulDataLoader.load_state_dict), or skip exactly the "
        "batches the saved step consumed, in global samples",
    ),
    "generator": (
        "its shuffling generator",
        "save the sampler's / loader's generator state and set it before the iterator is made",
    ),
    "workers": (
        "its per-worker state",
        "load the loader state before its workers start (persistent workers keep what they had)",
    ),
    "dataset": ("its dataset's state", "save and load the dataset's state_dict()"),
}
"""A data loader's parts: how the report names each, and its fix."""


def loader_parts(s: Subject) -> Optional[Finding]:
    """A data loader: which of its parts differ at the resume point, each with its fix."""
    if s.kind != "loader":
        return None
    found = [watched_part(k) for k in s.keys]
    parts = [p for p in LOADER_PARTS if p in found]
    shown = []
    for part in parts:
        key = watch_key(s.label, part)
        a, b = point_value(s.base, key), point_value(s.res, key)
        name = first_diff_name(a, b)
        if isinstance(a, dict) and isinstance(b, dict) and name in a and name in b:
            a, b = a[name], b[name]
        shown.append([part, name, readable(a), readable(b)])
    fixes = "; ".join(LOADER_PARTS[p][1] for p in parts)
    return Finding(s.where(), {"label": s.label, "parts": shown, "fixes": fixes})


def _loader_words(f: Finding) -> str:
    shown = [
        f"{LOADER_PARTS[part][0]} ({f'{name}: ' if name else ''}uninterrupted {a}, resumed {b})"
        for part, name, a, b in f["parts"]
    ]
    return (
        f"the data loader '{f['label']}' was not restored as saved: "
        + ", ".join(shown)
        + f" differ{'s' * (len(shown) == 1)} at the resume point"
    )


LOADER_RULE = Rule(
    "resume.object.loader-parts",
    (Stage.OBJECT,),
    DATA_LOADER_STATE,
    loader_parts,
    _loader_words,
    after=("resume.object.from-another-rank",),
)
