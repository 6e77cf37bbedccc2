"""interrupt="crash": where to kill, found in the uninterrupted run's file events, and what
a crash left on disk.

The points are the save's own events on one rank (rank 0, which writes the pointer files of
most trainers): the first, the middle and the last, right after the save returned, every
pointer-file write (a file written straight into the checkpoint root, beside the step
folders, such as `latest`), and inside every write over a file that existed (written in
place: `torn`, the file cut to half its size). Each is named by its index among that rank's
window's events of its kind of thread, which the crash launch's ranks count the same way
(`rank/crasher.py`).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..compare.comparators import Run
from ..errors import ResumeEquivError
from ..option_values import point_id_split
from ..rank.crasher import (
    AFTER_EVENT,
    RETURNED,
    STEP,
    TORN,
    TORN_OPS,
    WRITTEN,
    describe,
    foreign_folders,
    relative,
    save_events,
    size_words,
    thread_kind,
)
from ..rank.run_dir import PLUGIN_FILES, RANK_DIRS, user_files

NAMES = ("first", "middle", "last", "returned", "pointer", "torn", "step")
"""The points `crash_points=` may name; None means all of them, "all" every event too, and
inside every file's write. "step" is crash_mode="preempt"'s only; "returned" and "torn" are
not its (a SIGTERM holds no write and cuts no file)."""
NOT_IN_MODE = {"kill": (STEP,), "power": (STEP,), "preempt": (RETURNED, TORN)}
"""The kinds of point a crash mode has no use for."""
WRITES = ("open", "torch.save", "os.replace", "os.rename", "os.link", "os.symlink")

Choice = Union[None, str, int, Sequence[Union[str, int]]]


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
    overwrites: Optional[int] = None
    """The point's event writes a file (kind "torn": the file it cuts): the step after which
    that file was written before, still there when this save wrote over it (written in
    place); None for a new file."""
    power: bool = False
    """crash_mode="power": at the kill, every write not yet durable is rolled back
    (`power_loss.py`)."""
    preempt: Optional[float] = None
    """crash_mode="preempt": SIGTERM, then SIGKILL after this many seconds of grace
    (`preemption.py`)."""

    @property
    def id(self) -> str:
        """What `--resume-equiv-crash-point` takes to run this point alone: `s4.torn1`,
        `s4.event3.background.power`, `s4.step0.preempt` (the split, the kind and index, the
        thread when not the main one, the mode when not a kill)."""
        thread = "" if self.thread == "main" else f".{self.thread}"
        mode = ".power" if self.power else ".preempt" if self.preempt is not None else ""
        return f"s{self.split}.{self.kind}{self.index}{thread}{mode}"

    def to_context(self) -> dict[str, Any]:
        context = {
            "rank": self.rank,
            "index": self.index,
            "thread": self.thread,
            "kind": self.kind,
            "split": self.split,
            "foreign": list(self.foreign),
        }
        if self.preempt is not None:
            context["preempt"] = self.preempt
        return {**context, "power": True} if self.power else context

    def where(self, run_dir: str) -> str:
        """`rank 0: after os.replace(checkpoints/tmp-step_4 -> checkpoints/step_4)`."""
        if self.preempt is not None:
            return self._where(run_dir).replace(": ", ": SIGTERM ", 1)
        return self._where(run_dir)

    def _where(self, run_dir: str) -> str:
        if self.kind == STEP:
            return f"rank {self.rank}: inside step {self.split + 1}, before its optimizer step"
        if self.kind == RETURNED:
            return f"rank {self.rank}: after the save returned"
        if self.kind == WRITTEN:
            where = relative(str(self.event.get("path", "")), run_dir)
            return f"rank {self.rank}: after writing {where}"
        if self.kind == TORN:
            return f"rank {self.rank}: inside {describe(self.event, run_dir)}, cut to half"
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
    run: Run,
    split: int,
    splits: tuple[int, ...],
    choice: Choice,
    run_dir: str,
    modes: tuple[str, ...] = ("kill",),
    seed: int = 0,
    grace: float = 2.0,
) -> list[CrashPoint]:
    """The crash points of the save at `split` in the uninterrupted run `run` (written in
    `run_dir`), as `crash_points=` (`choice`) asks, each once per mode of `crash_mode=`
    (`modes`: "kill", "power", "preempt" with `grace` seconds; a power loss is named
    "<point> (power)", a SIGTERM "<point> (preempt)"). An int choice is that many of every
    point there is, sampled with `seed`: the same points every run."""
    rank, events = window(run, split, splits, run_dir)
    if not events:
        raise ResumeEquivError(
            f'interrupt="crash": the uninterrupted run logged no file event in its save at step '
            f"{split} (files are logged under its run directory {run_dir} and the checkpoint's "
            "folder): the trainer must save there, e.g. under checkpoint='{run_dir}/checkpoints'"
        )
    background = any(e.get("thread") for e in events)  # a write of the save in a thread
    foreign = foreign_folders(run[rank].files, split, splits, run_dir)
    overwrites = overwritten(run[rank].files, events)
    points = _wanted(choice, events, overwrites, split, rank)
    if isinstance(choice, int):  # drawn from the points some mode of the test has
        points = {k: v for k, v in points.items() if any(k[0] not in NOT_IN_MODE[m] for m in modes)}
        points = _sampled(points, choice, random.Random(f"{seed}:{split}"))
    if not points:  # only "torn" can stand for none: a test of no point proves nothing
        raise ResumeEquivError(
            f"crash_points={choice!r}: no such point in the save at step {split} on rank "
            f"{rank}: it writes no file over one that was there (torn points of every file: "
            'crash_points="all")'
        )
    found = [
        CrashPoint(
            ", ".join(dict.fromkeys(names)) + ("" if mode == "kill" else f" ({mode})"),
            rank,
            _kind_index(events, position) if kind != STEP else 0,
            thread_kind(events[position]),
            kind,
            split,
            foreign,
            events[position] if kind != STEP else {},
            completes=kind in (RETURNED, STEP) and not background,
            overwrites=overwrites.get(position),
            power=mode == "power",
            preempt=grace if mode == "preempt" else None,
        )
        for (kind, position), names in sorted(points.items(), key=_order)
        for mode in modes
        if kind not in NOT_IN_MODE[mode]
    ]
    if not found:
        raise ResumeEquivError(
            f"crash_points={choice!r}: no point of crash_mode={list(modes)!r} (a SIGTERM "
            '(preempt) has no "returned" or "torn" point, a kill or a power loss no "step")'
        )
    return found


def _order(item: tuple[tuple[str, int], list[str]]) -> tuple[int, bool]:
    """Points in the order of their events; "step" (after the save) last."""
    (kind, position), _ = item
    return position, kind == STEP


Points = dict[tuple[str, int], list[str]]
"""(kind, position among the save's events) -> the names `crash_points=` gave it."""


def _wanted(
    choice: Choice,
    events: list[dict[str, Any]],
    overwrites: dict[int, Optional[int]],
    split: int,
    rank: int,
) -> Points:
    """The points `crash_points=` names; a number samples from all of them (the default
    ones too, for a pointer's own kind of point)."""
    if choice is None:
        wanted: list[Union[str, int]] = list(NAMES)
    elif isinstance(choice, int):
        wanted = ["all", *NAMES]
    else:
        wanted = ["all"] if choice == "all" else list(choice)
    points: Points = {}
    for want in wanted:
        if isinstance(want, int) and not 0 <= want < len(events):
            raise ResumeEquivError(
                f"crash_points=: event {want} does not exist; the save at step {split} has "
                f"{len(events)} events on rank {rank} (0 to {len(events) - 1})"
            )
        for key, name in _chosen(want, events, overwrites):
            points.setdefault(key, []).append(name)
    return points


def _sampled(points: Points, count: int, draw: random.Random) -> Points:
    """`count` of `points`, drawn by `draw` from them in a fixed order (the same events give
    the same points for the same seed)."""
    keys = sorted(points, key=lambda key: (key[1], key[0]))
    chosen = draw.sample(keys, min(count, len(keys)))
    return {key: points[key] for key in chosen}


def point_split(wanted: str, splits: Sequence[int]) -> int:
    """The split a point id (`s4.torn1`) crashes, or a clear error."""
    split = point_id_split(wanted)
    if split is None or split not in splits:
        raise ResumeEquivError(
            f"--resume-equiv-crash-point={wanted}: a point id starts with the split it crashes "
            f"(s<split>., e.g. s{splits[-1]}.event0), one of this test's splits "
            f"{', '.join(map(str, splits))}: the report's rerun line names the point"
        )
    return split


def only_point(points: list[CrashPoint], wanted: str, split: int) -> list[CrashPoint]:
    """`--resume-equiv-crash-point`: the one point whose id is `wanted`, or a clear error
    listing the ids the save at `split` has."""
    found = [p for p in points if p.id == wanted]
    if not found:
        ids = ", ".join(p.id for p in points)
        raise ResumeEquivError(
            f"--resume-equiv-crash-point={wanted}: the save at step {split} has no such point; "
            f"its points are {ids}"
        )
    return found[:1]


def _chosen(
    want: Union[str, int], events: list[dict[str, Any]], overwrites: dict[int, Optional[int]]
) -> list[tuple[tuple[str, int], str]]:
    """The points one name (or event index) of `crash_points=` stands for: ((kind, position
    among the window's events), name)."""
    if isinstance(want, int):
        return [((AFTER_EVENT, want), f"event {want}")]
    main = [i for i, e in enumerate(events) if not e.get("thread")]
    if want == "returned":
        return [((RETURNED, main[-1]), "returned")] if main else []
    if want == "step":  # after every event of the save
        return [((STEP, len(events) - 1), "step")]
    if want == "all":  # every event, the return, and inside every file's first write
        every = [((AFTER_EVENT, i), f"event {i}") for i in range(len(events))]
        torn = [((TORN, i), "torn") for i in overwrites]
        step = _chosen("step", events, overwrites)
        return every + _chosen("returned", events, overwrites) + torn + step
    if want == "torn":  # inside each write over a file that was there (in place)
        return [((TORN, i), "torn") for i, step in overwrites.items() if step is not None]
    named = {
        "first": [0],
        "middle": [len(events) // 2],
        "last": [len(events) - 1],
        "pointer": _pointers(events),
    }
    chosen = []
    for index in named[want]:
        opened = want == "pointer" and events[index].get("op") == "open"
        kind = WRITTEN if opened else AFTER_EVENT  # a pointer: once it is written
        chosen.append(((kind, index), want))
    return chosen


def overwritten(
    log: list[dict[str, Any]], events: list[dict[str, Any]]
) -> dict[int, Optional[int]]:
    """For the first write of each file among the save's `events` (by position): the step
    after which the rank's whole `log` last wrote that file before, when it was still there
    (renamed onto, not moved away or deleted since): a write in place; else None."""
    there: dict[str, int] = {}  # path -> the step after which it was written
    firsts: dict[int, Optional[int]] = {}
    files: set[str] = set()
    position = {id(e): i for i, e in enumerate(events)}
    for event in log:
        op, path = event.get("op"), str(event.get("path", ""))
        to, step = str(event.get("to") or ""), int(event.get("after_step") or 0)
        index = position.get(id(event))
        if op in TORN_OPS and index is not None and path not in files:
            files.add(path)
            firsts[index] = there.get(path)
        if op in TORN_OPS:
            there[path] = step
        elif op in ("os.replace", "os.rename") and to:
            moved = {k: v for k, v in there.items() if _under(k, path)}
            there = {k: v for k, v in there.items() if not _under(k, path) and not _under(k, to)}
            there.update({to + k[len(path) :]: v for k, v in moved.items()})
        elif op in ("os.link", "os.symlink") and to:
            there[to] = step
        elif op in ("os.unlink", "os.remove", "os.rmdir", "shutil.rmtree"):
            there = {k: v for k, v in there.items() if not _under(k, path)}
    return firsts


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


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
        inner = ", ".join(f"{name} {size_words(size)}" for name, size in shown)
        if len(shown) < len(files):
            inner += f", +{len(files) - len(shown)} more"
        parts.append(f"{folder}/{{{inner}}}" if folder else inner)
    if not parts:
        return "nothing"
    more = f", +{len(parts) - limit} folders" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def lay_out(crash_dir: str, run_dir: str) -> None:
    """Copy what the training wrote into `crash_dir` (not the plugin's own files) into
    `run_dir`: folders (empty ones too), files, and links as they are (a broken one too; one
    into `crash_dir` points into `run_dir` instead): the layout a restarted job finds."""
    for folder, dirnames, filenames in os.walk(crash_dir):
        if folder == crash_dir:
            dirnames[:] = [d for d in dirnames if d not in RANK_DIRS]
            filenames = [f for f in filenames if f not in PLUGIN_FILES]
        into = os.path.join(run_dir, os.path.relpath(folder, crash_dir))
        os.makedirs(into, exist_ok=True)
        for name in [*dirnames, *filenames]:
            source, target = os.path.join(folder, name), os.path.join(into, name)
            if os.path.islink(source):
                link = os.readlink(source)
                if os.path.isabs(link) and not os.path.isabs(relative(link, crash_dir)):
                    link = os.path.join(run_dir, relative(link, crash_dir))
                os.symlink(link, target)
            elif name in filenames:
                shutil.copy2(source, target)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(folder, d))]


def crashed_where(record: Optional[dict[str, Any]], run_dir: str) -> str:
    """The crash record's point, in the report's words."""
    if record is None:
        return ""
    return f"rank {record.get('rank')}: {record.get('where', '?')}"


__all__ = [
    "NAMES",
    "CrashPoint",
    "crashed_where",
    "find_points",
    "lay_out",
    "on_disk",
    "only_point",
    "point_split",
    "relative",
]
