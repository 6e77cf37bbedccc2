"""crash_mode="power": what a power loss at a crash point leaves on disk, read from the crash
launch's file events: every write that was not yet durable is rolled back.

The model is POSIX's, taken strictly (`man 2 fsync`): a file's data is durable up to the
size its last `os.fsync` covered (never fsynced: none of it); a name made in a folder (a
file created, a rename, a link) is durable once that folder was fsynced after it (both
folders, for a rename from one into another). A deletion stays done (the worse case, for a
saver that deletes its previous checkpoint), and folders stay (creating one is not logged).
Only what the file-event log saw is rolled back: a file written by a call it does not watch
(`os.write` on a raw descriptor, the inner writes of a synchronous DCP save) is left as is.

`unsynced` reads the events of every rank of the host (pure); `roll_back` applies it to the
crash launch's run directory, newest first: a rename moved back (the file it replaced
brought back from the hard link the rank kept, `rank/files.py`), a created file removed;
then every file cut to what its last fsync covered. What was rolled back comes back as
records (`path`s relative to the run directory) for the point's row and its cause.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.crasher import TORN_OPS, relative, size_words

RENAMES = ("os.replace", "os.rename")
LINKS = ("os.link", "os.symlink")
DELETES = ("os.unlink", "os.remove", "os.rmdir", "shutil.rmtree")
SHOWN = 6
"""How many rolled-back writes a row names."""


@dataclass(eq=False)
class Inode:
    """One file's data: the size its last fsync covered (None: not known, left alone)."""

    synced: Optional[int] = 0
    written: Optional[dict[str, Any]] = None
    """The event that last wrote it."""
    fsynced: bool = False


@dataclass(eq=False)
class Change:
    """A name made in a folder: `kind` "create", "link" or "rename"."""

    kind: str
    event: dict[str, Any]
    at: str
    """Where what it made is now (the name created; a rename's target)."""
    dirs: set[str]
    """The folders still to be fsynced for it to be durable."""
    source: str = ""
    """A rename: the name it had before."""
    replaced: Optional[Inode] = None
    """A rename: the file it replaced (kept as the event's `replaced` hard link)."""
    moved: list[Change] = field(default_factory=list)
    """A rename: the earlier changes whose file (or folder) it moved."""
    replaced_by: list[Change] = field(default_factory=list)
    gone: bool = False
    """Its file was deleted since."""

    @property
    def durable(self) -> bool:
        return not self.dirs

    @property
    def undone(self) -> bool:
        """Rolled back by a power loss now: not durable, still there, and not replaced by a
        rename that is durable."""
        return not self.durable and not self.gone and not any(r.durable for r in self.replaced_by)


@dataclass
class Unsynced:
    """What a power loss at the end of the events rolls back."""

    changes: list[Change]
    """The names to undo, in the order they were made."""
    files: dict[str, Inode]
    """Every file the events wrote, where it is at the kill."""


def merged(runs: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The file events of several ranks in one order (each rank's own kept)."""
    return list(heapq.merge(*runs, key=lambda e: int(e.get("time_ns") or 0)))


def unsynced(events: list[dict[str, Any]]) -> Unsynced:
    """What of `events` (in order) a power loss after the last one undoes (pure)."""
    files: dict[str, Inode] = {}
    changes: list[Change] = []
    for event in events:
        op, path, to = event.get("op"), str(event.get("path") or ""), str(event.get("to") or "")
        live = [c for c in changes if not c.durable and not c.gone]
        if op in TORN_OPS:
            if path not in files:
                files[path] = Inode()
                changes.append(Change("create", event, path, {os.path.dirname(path)}))
            files[path].written = event
        elif op == "os.fsync":
            _fsync(event, path, files, live)
        elif op in RENAMES and to:
            changes.append(_rename(event, path, to, files, live))
        elif op in LINKS and to:
            same = op == "os.link" and path in files
            files[to] = files[path] if same else Inode(None)
            changes.append(Change("create", event, to, {os.path.dirname(to)}))
        elif op in DELETES:
            for name in [n for n in files if _under(n, path)]:
                del files[name]
            for change in live:
                change.gone = change.gone or _under(change.at, path)
    return Unsynced([c for c in changes if c.undone], files)


def _fsync(event: dict[str, Any], path: str, files: dict[str, Inode], live: list[Change]) -> None:
    if event.get("folder"):
        for change in live:
            change.dirs.discard(path)
    elif path in files and isinstance(event.get("size"), int):
        files[path].synced, files[path].fsynced = int(event["size"]), True


def _rename(
    event: dict[str, Any], src: str, dst: str, files: dict[str, Inode], live: list[Change]
) -> Change:
    """The rename `src` -> `dst`: what it replaced, the earlier changes it moves, and the
    folders it waits on."""
    dirs = {os.path.dirname(src), os.path.dirname(dst)}
    change = Change("rename", event, dst, dirs, source=src, replaced=files.get(dst))
    for earlier in live:
        if _under(earlier.at, dst):
            earlier.replaced_by.append(change)
    for earlier in live:
        if _under(earlier.at, src):
            earlier.at = _moved(earlier.at, src, dst)
            change.moved.append(earlier)
        if earlier.source.startswith(src + os.sep):
            earlier.source = _moved(earlier.source, src, dst)
        earlier.dirs = {_moved(d, src, dst) if _under(d, src) else d for d in earlier.dirs}
    for name in [n for n in files if _under(n, dst)]:
        del files[name]
    for name in [n for n in files if _under(n, src)]:
        files[_moved(name, src, dst)] = files.pop(name)
    return change


def _under(path: str, folder: str) -> bool:
    return bool(folder) and (path == folder or path.startswith(folder + os.sep))


def _moved(path: str, src: str, dst: str) -> str:
    return dst + path[len(src) :] if _under(path, src) else path


def roll_back(found: Unsynced, run_dir: str) -> list[dict[str, Any]]:
    """Apply `found` in `run_dir`: the names undone, newest first, then every file cut to
    its durable size. The records of what was rolled back, in the order it was written."""
    files = dict(found.files)
    done: list[tuple[int, dict[str, Any]]] = []
    order = {id(c.event): n for n, c in enumerate(found.changes)}
    for change in reversed(found.changes):
        record = _undo(change, files)
        if record is not None:
            done.append((order[id(change.event)], record))
    cuts = [r for path, inode in sorted(files.items()) if (r := _cut(path, inode)) is not None]
    records = [r for _, r in sorted(done, key=lambda item: item[0])] + cuts
    for record in records:
        for key in ("path", "to"):
            if record.get(key):
                record[key] = relative(record[key], run_dir)
        record["dirs"] = [relative(d, run_dir) for d in record.get("dirs", ())]
        if record["kind"] == "rename":
            record["now"] = _now(os.path.join(run_dir, record["to"]))
    return records


def _undo(change: Change, files: dict[str, Inode]) -> Optional[dict[str, Any]]:
    """Undo one change on disk (and in `files`); its record, None when nothing was there."""
    event = change.event
    record = {
        "kind": change.kind,
        "op": event.get("op"),
        "path": str(event.get("path") or ""),
        "after_step": event.get("after_step"),
        "dirs": sorted(change.dirs),
    }
    if change.kind == "create":
        files.pop(change.at, None)
        if not _remove(change.at):
            return None
        return record
    record["to"] = str(event.get("to") or "")
    if not os.path.lexists(change.at) or os.path.lexists(change.source):
        return None
    os.makedirs(os.path.dirname(change.source), exist_ok=True)
    os.rename(change.at, change.source)
    for name in [n for n in files if _under(n, change.at)]:
        files[_moved(name, change.at, change.source)] = files.pop(name)
    for earlier in change.moved:
        earlier.at = _moved(earlier.at, change.at, change.source)
    kept = str(event.get("replaced") or "")
    record["restored"] = bool(kept) and os.path.isfile(kept)
    if record["restored"]:
        os.rename(kept, change.at)
        if change.replaced is not None:
            files[change.at] = change.replaced
    return record


def _remove(path: str) -> bool:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            return False  # a folder is never a file's name: not ours to remove
        os.unlink(path)
    except OSError:
        return False
    return True


def _cut(path: str, inode: Inode) -> Optional[dict[str, Any]]:
    """Cut `path` to what its last fsync covered; its record, None when nothing was cut."""
    if inode.synced is None or os.path.islink(path) or not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if size <= inode.synced:
        return None
    os.truncate(path, inode.synced)
    written = inode.written or {}
    return {
        "kind": "cut",
        "op": written.get("op", "open"),
        "path": path,
        "after_step": written.get("after_step"),
        "size": inode.synced,
        "of": size,
        "fsynced": inode.fsynced,
    }


def _now(path: str) -> str:
    """What a name holds after the rollback: "is gone", "is empty", "reads 'step_2'"."""
    if not os.path.lexists(path):
        return "is gone"
    if os.path.isdir(path):
        return "is a folder"
    size = os.path.getsize(path)
    if size == 0:
        return "is empty"
    if size <= 64:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
        if text.isprintable():
            return f"reads {text!r}"
    return f"holds {size_words(size)}"


def record_words(record: dict[str, Any]) -> str:
    """One rolled-back write in a row's words."""
    unsynced_dirs = " and ".join(record.get("dirs") or ()) or "its folder"
    step = record.get("after_step")
    at = f" at step {step}" if step is not None else ""
    if record["kind"] == "cut":
        synced = "fsynced at that size" if record.get("fsynced") else "never fsynced"
        return (
            f"{record['path']} cut to {size_words(record['size'])} of "
            f"{size_words(record['of'])} (written{at}; {synced})"
        )
    if record["kind"] == "rename":
        back = ", the file it replaced back" if record.get("restored") else ""
        when = f"at step {step}; " if step is not None else ""
        return (
            f"{record['op']}({record['path']} -> {record['to']}) undone{back} "
            f"({when}{unsynced_dirs} not fsynced after)"
        )
    return f"{record['path']} removed (created{at}; {unsynced_dirs} not fsynced after)"


def rolled_back_words(records: list[dict[str, Any]]) -> str:
    """The row's `rolled back:` line."""
    if not records:
        return "nothing (every write was durable)"
    shown = [record_words(r) for r in records[:SHOWN]]
    more = f", +{len(records) - SHOWN} more" if len(records) > SHOWN else ""
    return ", ".join(shown) + more


__all__ = ["Unsynced", "merged", "roll_back", "rolled_back_words", "unsynced"]
