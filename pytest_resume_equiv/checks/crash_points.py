"""interrupt="crash": where to kill, found in the uninterrupted run's file events, and what
a crash left on disk.

The points are the save's own events on one rank (rank 0, which writes the pointer files of
most trainers): the first, the middle and the last, right after the save returned, and every
pointer-file write (a file written straight into the checkpoint root, beside the step
folders, such as `latest`). Each is named by its index among that rank's window's events of
its kind of thread, which the crash launch's ranks count the same way (`rank/crash.py`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..compare.comparators import Run
from ..errors import ResumeEquivError
from ..rank.crasher import (
    AFTER_EVENT,
    RETURNED,
    WRITTEN,
    describe,
    foreign_folders,
    relative,
    save_events,
    thread_kind,
)
from ..rank.run_dir import user_files

NAMES = ("first", "middle", "last", "returned", "pointer")
"""The points `crash_points=` may name; None means all of them, "all" every event too."""
WRITES = ("open", "torch.save", "os.replace", "os.rename", "os.link", "os.symlink")

Choice = Union[None, str, Sequence[Union[str, int]]]


@dataclass(frozen=True)
class CrashPoint:
    name: str
    """How the report names it: "first", "last, pointer", "event 3", "returned"."""
    rank: int
    index: int
    """The event's index among the window's events of its `thread` kind (kind "returned":
    the last main-thread one)."""
    thread: str
    """"main" or "background" (`rank.crash.thread_kind`)."""
    kind: str
    split: int
    foreign: tuple[str, ...]
    """The folders whose background writes before the save began are the save before's
    (`rank.crash.foreign_folders`)."""
    event: dict[str, Any]
    """The uninterrupted run's event at `index`."""
    completes: bool
    """The save had completed when the kill came: it returned, and nothing of it runs in the
    background."""

    def to_context(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "index": self.index,
            "thread": self.thread,
            "kind": self.kind,
            "split": self.split,
            "foreign": list(self.foreign),
        }

    def where(self, run_dir: str) -> str:
        """`rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)`."""
        if self.kind == RETURNED:
            return f"rank {self.rank}: after the save returned"
        if self.kind == WRITTEN:
            where = relative(str(self.event.get("path", "")), run_dir)
            return f"rank {self.rank}: after writing {where}"
        return f"rank {self.rank}: after {describe(self.event, run_dir)}"


def window(
    run: Run, split: int, splits: tuple[int, ...], run_dir: str
) -> tuple[int, list[dict[str, Any]]]:
    """The rank whose save is split into points, and its events in the save at `split`."""
    for rank in sorted(run):
        events = save_events(run[rank].files, split, splits, run_dir)
        if events:
            return rank, events
    return 0, []


def _pointers(events: list[dict[str, Any]]) -> list[int]:
    """Writes of a file straight into the shallowest folder the save writes in, where the
    others write below it (the step folders): a pointer such as `latest`."""
    targets = []
    for event in events:
        target = event.get("to") or event.get("path")
        if event.get("op") in WRITES and target and not event.get("thread"):
            targets.append(os.path.dirname(str(target)))
        else:
            targets.append(None)
    folders = [t for t in targets if t is not None]
    if not folders:
        return []
    root = min(folders, key=lambda f: f.count(os.sep))
    deeper = any(f.startswith(root + os.sep) for f in folders)
    found = []
    for index, (event, folder) in enumerate(zip(events, targets)):
        target = str(event.get("to") or event.get("path"))
        if deeper and folder == root and not _folder(target, event, events):
            found.append(index)
    return found


def _folder(target: str, event: dict[str, Any], events: list[dict[str, Any]]) -> bool:
    """Whether the save wrote into `target` (or into what it renamed onto it): a folder."""
    inside = {str(target) + os.sep, str(event.get("path")) + os.sep}
    paths = [str(e.get(k)) for e in events for k in ("path", "to") if e.get(k)]
    return any(p.startswith(prefix) for p in paths for prefix in inside) or os.path.isdir(target)


def find_points(
    run: Run, split: int, splits: tuple[int, ...], choice: Choice, run_dir: str
) -> list[CrashPoint]:
    """The crash points of the save at `split` in the uninterrupted run `run` (written in
    `run_dir`), as `crash_points=` (`choice`) asks."""
    rank, events = window(run, split, splits, run_dir)
    if not events:
        raise ResumeEquivError(
            f'interrupt="crash": the uninterrupted run logged no file event in its save at step '
            f"{split} (files are logged under its run directory {run_dir} and the checkpoint's "
            "folder): the trainer must save there, e.g. under checkpoint='{run_dir}/checkpoints'"
        )
    main = [i for i, e in enumerate(events) if not e.get("thread")]
    background = len(main) < len(events)  # a write of the save in a thread
    foreign = foreign_folders(run[rank].files, split, splits, run_dir)
    named: dict[str, list[int]] = {
        "first": [0],
        "middle": [len(events) // 2],
        "last": [len(events) - 1],
        "pointer": _pointers(events),
    }
    wanted = list(NAMES) if choice is None else ["all"] if choice == "all" else list(choice)
    points: dict[tuple[str, int], list[str]] = {}
    for want in wanted:
        if want == "all":
            for index in range(len(events)):
                points.setdefault((AFTER_EVENT, index), []).append(f"event {index}")
            want = "returned"
        if want == "returned":
            if main:
                points.setdefault((RETURNED, main[-1]), []).append("returned")
        elif isinstance(want, int):
            if not 0 <= want < len(events):
                raise ResumeEquivError(
                    f"crash_points=: event {want} does not exist; the save at step {split} has "
                    f"{len(events)} events on rank {rank} (0 to {len(events) - 1})"
                )
            points.setdefault((AFTER_EVENT, want), []).append(f"event {want}")
        else:
            for index in named[want]:
                opened = want == "pointer" and events[index].get("op") == "open"
                kind = WRITTEN if opened else AFTER_EVENT  # a pointer: once it is written
                points.setdefault((kind, index), []).append(want)
    return [
        CrashPoint(
            ", ".join(dict.fromkeys(names)),
            rank,
            _kind_index(events, position),
            thread_kind(events[position]),
            kind,
            split,
            foreign,
            events[position],
            completes=kind == RETURNED and not background,
        )
        for (kind, position), names in sorted(points.items(), key=lambda item: item[0][1])
    ]


def _kind_index(events: list[dict[str, Any]], position: int) -> int:
    """The index of `events[position]` among the events of its kind of thread."""
    kind = thread_kind(events[position])
    return sum(1 for e in events[:position] if thread_kind(e) == kind)


def on_disk(run_dir: str, limit: int = 10) -> str:
    """What a crash left in the run directory: files with their sizes, grouped by folder."""
    folders: dict[str, list[tuple[str, int]]] = {}
    for path, size in user_files(run_dir):
        if size is not None:
            folder, name = os.path.split(path)
            folders.setdefault(folder, []).append((name, size))
    parts = []
    for folder, files in sorted(folders.items()):
        # an empty file is often what a crash left half-written: never hidden
        shown = [f for f in files if f[1] == 0] + [f for f in files if f[1]]
        shown = shown if len(shown) <= 8 else shown[:7]
        inner = ", ".join(f"{name} {_size(size)}" for name, size in shown)
        if len(shown) < len(files):
            inner += f", +{len(files) - len(shown)} more"
        parts.append(f"{folder}/{{{inner}}}" if folder else inner)
    if not parts:
        return "nothing"
    more = f", +{len(parts) - limit} folders" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else f"{size / 2**20:.1f} MiB"


def crashed_where(record: Optional[dict[str, Any]], run_dir: str) -> str:
    """The crash record's point, in the report's words."""
    if record is None:
        return ""
    return f"rank {record.get('rank')}: {record.get('where', '?')}"


__all__ = ["NAMES", "CrashPoint", "crashed_where", "find_points", "on_disk", "relative"]
