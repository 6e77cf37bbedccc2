"""Which step the checkpoint a resumed launch loaded is of, from two kinds of evidence: the
step counters its load restored (automatic recording: optimizer `step`, scheduler
`last_epoch`, rank/auto.py) read against the counters the uninterrupted run had after each
step, and the files its restore log read before the first step, each of the step after which
the launch that wrote the checkpoint saved it (that launch's file events).

A resumed launch numbers its first step `split + 1`; when the load says otherwise ("the
checkpoint loaded is of step 6, not step 3: the optimizer's step counter is 6, the files read
were written after step 6") that is a finding, never a silent renumbering. It never
contradicts the resume-point gate: when the state at the resume point equals the
checkpoint's writer's at the split, whatever else the counters or the files say is no finding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..rank.layout import target_file
from ..signature import Signature
from . import facts

Run = dict[int, Signature]
REMOVALS = ("os.unlink", "os.remove", "os.rmdir", "shutil.rmtree")
"""File events that write nothing (rank/files.py)."""


@facts.fact("loaded_step")
@dataclass
class LoadedStep:
    split: int
    found: dict[str, int] = field(default_factory=dict)
    """rank -> the step the loaded counters belong to, where it is not the split."""
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    """rank -> the counters the load restored (of the ranks in the finding)."""
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    """rank -> each file its restore log read and the step after which the launch that wrote
    the checkpoint last wrote it (of the ranks in the finding)."""

    @property
    def failed(self) -> bool:
        return bool(self.counters or self.files)

    def lines(self, label: str) -> list[str]:
        if not self.failed:
            return []
        ranks = sorted(set(self.counters) | set(self.files), key=int)
        rank = ranks[0]
        counted = self.found.get(rank, self.split if rank in self.counters else None)
        read = sorted(set(self.files.get(rank, {}).values()))
        steps = sorted({s for s in [counted, *read] if s is not None})
        evidence = [*_counter_words(self.counters.get(rank, {}), counted), *self._file_words(rank)]
        where = ", ".join(f"rank {r}" for r in ranks)
        if len(steps) == 1:
            head = f"the checkpoint loaded is of step {steps[0]}, not step {self.split}"
        else:
            head = (
                f"what was loaded is of steps {' and '.join(map(str, steps))}, not of step "
                f"{self.split} alone"
            )
        return [
            f"{label}: {head} ({where}: {', '.join(evidence)}); the resumed run went on as if "
            f"from step {self.split}. Load the checkpoint saved at step {self.split} (a "
            "'latest' link or a rolling path may point at a later save)"
        ]

    def _file_words(self, rank: str) -> list[str]:
        by_step: dict[int, list[str]] = {}
        for path, step in sorted(self.files.get(rank, {}).items()):
            by_step.setdefault(step, []).append(os.path.basename(path.rstrip(os.sep)))
        words = []
        for step, names in sorted(by_step.items()):
            shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
            files = "the file read" if len(names) == 1 else "the files read"
            verb = "was" if len(names) == 1 else "were"
            words.append(f"{files} ({shown}) {verb} written after step {step}")
        return words

    def summary(self, label: str) -> list[str]:
        return self.lines(label)


def _counter_words(counters: dict[str, int], step: Optional[int]) -> list[str]:
    """`the optimizer's step counter is 6`, `lr_scheduler's last_epoch is 6`, then whose."""
    words = [
        f"the {name}'s step counter is {value}"
        if name.startswith("optimizer")
        else f"the {name}'s last_epoch is {value}"
        for name, value in counters.items()
    ]
    if words and step is not None:
        words[-1] += f" (the uninterrupted run's after step {step})"
    return words


def loaded_step(
    reference: Run,
    run: Run,
    split: int,
    writer: Optional[Run] = None,
    gate_held: bool = False,
) -> Optional[LoadedStep]:
    """The finding, or None when the load agrees with the split, says nothing, or the gate
    held. `writer`: the launch that wrote the checkpoint (default `reference`), whose file
    events date the files read; `gate_held`: the resume point equals that launch's state at
    the split (then no finding: the gate has judged the state loaded)."""
    if gate_held:
        return None
    written = _written(reference if writer is None else writer)
    result = LoadedStep(split)
    for rank, sig in sorted(run.items()):
        counters = _telling((sig.loaded or {}).get("counters") or {}, reference.get(rank))
        counted = _counted_step(counters, reference.get(rank), split)
        of_split = _split_labels(sig, split, written)
        read = {
            path: split if label in of_split else label + (split - max(of_split or {split}))
            for path in _read_files(sig)
            if (label := _step_of(path, written)) is not None
        }
        if counted in (None, split) and all(s == split for s in read.values()):
            continue
        if counted not in (None, split):
            result.found[str(rank)] = counted
        if counted is not None:
            result.counters[str(rank)] = dict(counters)
        if read:
            result.files[str(rank)] = read
    return result if result.failed else None


def _telling(loaded: dict[str, int], base: Optional[Signature]) -> dict[str, int]:
    """The counters that tell steps apart: those the uninterrupted run's steps changed (plain
    SGD keeps no step, read as 0 after every step)."""
    if base is None:
        return {}
    after = list(base.counters.values())
    return {k: v for k, v in loaded.items() if len({str(c.get(k)) for c in after}) > 1}


def _counted_step(loaded: dict[str, int], base: Optional[Signature], split: int) -> Optional[int]:
    """The step of the uninterrupted run whose counters the load restored: the split when
    they agree with its, else the first other step they agree with; None when there are no
    counters, or they are of no step the run had (the comparison then says)."""
    if not loaded or base is None or not base.counters:
        return None
    at_split = base.counters.get(split)
    if at_split is not None and _agrees(loaded, at_split):
        return split
    matching = [s for s, c in sorted(base.counters.items()) if _agrees(loaded, c)]
    return matching[0] if matching else None


def _agrees(loaded: dict[str, int], after: dict[str, int]) -> bool:
    shared = set(loaded) & set(after)
    return bool(shared) and all(loaded[k] == after[k] for k in shared)


def _read_files(sig: Signature) -> list[str]:
    """The files the restore log read before the first step (entries after no step)."""
    paths = []
    for entry in sig.restores:
        path = target_file(str(entry.get("what", "")))
        if path and entry.get("after_step") is None and path not in paths:
            paths.append(path)
    return paths


def _written(run: Run) -> list[tuple[str, int]]:
    """Every path the launch wrote (or renamed into place) after a step, with that step, in
    the order written (every rank's: one rank may write the files all ranks read)."""
    out = []
    for sig in run.values():
        for event in sig.files:
            step = event.get("after_step")
            if not isinstance(step, int) or isinstance(step, bool) or event.get("op") in REMOVALS:
                continue
            target = event.get("to") or event.get("path")
            if target:
                out.append((os.path.realpath(target), step))
    return out


def _split_labels(sig: Signature, split: int, written: list[tuple[str, int]]) -> set[int]:
    """The steps the writer's save log labels the save of the split with, read from the
    checkpoint the resume was pointed at: the split, or split-1 for a trainer that saves
    before its `record(step)` (some files of one save may be written before it, some after).
    Empty when that checkpoint says nothing (none given, or a rolling path written after
    other steps too): the labels are taken as they are."""
    given = ((sig.resume_point(split) or {}).get("checkpoint") or {}).get("path")
    if not given:
        return set()
    real = os.path.realpath(given)
    labels = {a for t, a in written if t == real or _under(t, real) or _under(real, t)}
    return labels if labels and labels <= {split - 1, split} else set()


def _step_of(path: str, written: list[tuple[str, int]]) -> Optional[int]:
    """The step after which the file (or folder) at `path` was last written: a write of it,
    inside it (a folder read whole, as DCP's) or of a folder holding it (DCP's save)."""
    real = os.path.realpath(path)
    step = None
    for target, after in written:
        if target == real or _under(target, real) or _under(real, target):
            step = max(after, step) if step is not None else after
    return step


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)
