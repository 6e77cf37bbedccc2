"""One reading of a resumed run's restore log up to its resume point, shared by the gate
(what the log says of an item that differs) and the diagnosis (how each stream or object was
restored): where the resume begins, which calls restored a subject and which only seeded it
again, and whether a load wrote tensors in place (DCP's, which restores unlogged)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..rank.layout import target_covers, target_file
from ..rank.restore import is_load, is_seed


@dataclass(frozen=True)
class Restores:
    """One subject's entries of the log, by index."""

    restoring: list[int]
    """Calls that restored it: a seeding counts only after the resume began."""
    reseeds: list[int]
    """Seedings after the resume began (they replace the restored state)."""
    before_resume: list[int]
    """Calls for it up to where the resume began (initialisation, a pretrained load)."""


@dataclass(frozen=True)
class RestoreHistory:
    log: list[dict[str, Any]]
    """The restore log up to the resume point."""
    resume_begins: int
    """Where the resume begins: the first read of a file inside the checkpoint (weights
    loaded from elsewhere before it, a pretrained model, are not the resume); else the first
    load of any kind."""
    in_place: bool
    """A load wrote tensors in place (DCP's): a module may be restored unlogged."""

    @property
    def only_seeding(self) -> bool:
        """No load and no restore call, seeding at most: nothing was restored (a restart)."""
        return all(is_seed(e["call"]) for e in self.log)

    def of(self, subject: str) -> Restores:
        """The entries of the log for `subject` (`rng:cpu`, `watch:model`; an entry for
        `rng:cuda:*` covers every cuda device)."""
        mine = [i for i, e in enumerate(self.log) if target_covers(e["what"], subject)]
        seed = {i for i in mine if is_seed(self.log[i]["call"])}
        after = [i for i in mine if i > self.resume_begins]
        return Restores(
            restoring=[i for i in mine if i not in seed or i > self.resume_begins],
            reseeds=[i for i in after if i in seed],
            before_resume=[i for i in mine if i <= self.resume_begins],
        )


def restore_history(restores: list[dict[str, Any]], point: Optional[dict]) -> RestoreHistory:
    """The history of a resumed run whose restore log is `restores` and whose resume-point
    snapshot is `point` (how many entries came before it, which checkpoint it was given)."""
    log = restores[: (point or {}).get("restores", len(restores))]
    checkpoint = ((point or {}).get("checkpoint") or {}).get("path")
    return RestoreHistory(
        log,
        _checkpoint_read(log, checkpoint),
        any(e["call"].endswith("checkpoint.load") for e in log),
    )


def _checkpoint_read(log: list[dict[str, Any]], checkpoint: Optional[str]) -> int:
    if checkpoint:
        inside = os.path.abspath(checkpoint)
        for i, entry in enumerate(log):
            path = target_file(entry["what"])
            if path and os.path.abspath(path).startswith(inside):
                return i
    return next((i for i, e in enumerate(log) if is_load(e["call"])), len(log))
