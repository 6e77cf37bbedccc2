"""The file-event log: every file the training writes, renames, links or deletes in the run's
folders, in order, with the step it came after.

A checkpoint's files tell what state they hold only together with who wrote them and when:
"written again by the uninterrupted run at step 5" (a rolling path), "written by the resumed
run after it had loaded them" (nothing wrong), "still being written after the run went on"
(a background save) read the same from a folder's newest file time. So each rank logs the
events themselves: `open` for writing, `os.replace` / `rename` / `link` / `unlink` / `rmdir`,
`shutil.rmtree`, `os.fsync`, and the savers whose inner writes belong to one call
(`torch.save`, DCP's `save` / `async_save`, safetensors' `save_file`). Only the outermost of
nested calls is logged (`torch.save` opens its file), and only paths inside the folders given
(the launch's run directory, the checkpoint's); the plugin's own files are left out.

Two things are kept beside the events, for what a failed rank says in its status file: the
last files opened for reading there (`reads`: what a resume read), and, on an exception out
of a watched call, which call it was (`wrapping.tag_failure`: "os.replace onto step_4").

For a power-loss crash launch (`checks/power_loss.py` rolls back what was not durable) an
`os.fsync` event says what it made durable (`size`: the file's size then; `folder`: a
folder's names), and with `keep_into` set, a rename onto an existing file first keeps a hard
link to that file there, named in the event (`replaced`): the rollback brings it back.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import shutil
import stat
import sys
import threading
import time
from typing import Any, Callable, Optional

from .run_dir import PLUGIN_FILES, RANK_DIRS
from .wrapping import Wrapper, tag_failure

Event = dict[str, Any]
"""One event: `op`, `path` (and `to` for a rename or link), `after_step` (the last step
recorded before it), `time_ns`, and `thread` when not the main thread (a background save)."""

WRITE_MODES = set("wax+")
RENAMES = ("os.replace", "os.rename")
READS_KEPT = 8
"""How many of the last files opened for reading a rank keeps (`FileLog.reads`)."""


class FileLog:
    """One rank's file events and the wrappers that feed them (`install`, `uninstall`)."""

    def __init__(self) -> None:
        self.roots: list[str] = []
        self.after_step: Any = None
        self.listeners: list[Callable[[Event], None]] = []
        self.before_listeners: list[Callable[[Event], None]] = []
        """Called before each file call (a file written before it has been closed), with the
        call: `op` and `path` (its first path as given, "" when it has none)."""
        self._opened_to_read: collections.deque[str] = collections.deque(maxlen=8 * READS_KEPT)
        """The last files opened for reading anywhere (absolute, as opened): `reads` keeps
        those in the watched folders, resolved only when asked."""
        self._calls = Wrapper(__name__)
        self.keep_into: Optional[str] = None
        """A power-loss crash launch: the folder a file a rename replaces is kept in."""
        self._kept = threading.local()
        self._kept_count = 0
        self._keep_lock = threading.Lock()

    def watch(self, *folders: Optional[str]) -> None:
        """Log events inside `folders` (a folder that does not exist yet is fine)."""
        for folder in folders:
            if folder:
                root = os.path.realpath(folder)
                if root not in self.roots:
                    self.roots.append(root)

    def inside(self, path: str) -> Optional[str]:
        """`path` as logged (its real path) if it is in a watched folder and not the
        plugin's own, else None."""
        real = os.path.realpath(path)
        for root in self.roots:
            if real == root or real.startswith(root + os.sep):
                first = os.path.relpath(real, root).split(os.sep)[0]
                own = any(first == f or first.startswith(f + ".") for f in PLUGIN_FILES)
                if first in RANK_DIRS or own:
                    return None  # the plugin's own (also a temporary `store-port.tmp`)
                return real
        return None

    def log(self, op: str, path: Any, to: Any = None, **extra: Any) -> None:
        """One event (`extra`: more of its facts, e.g. an fsync's `size`)."""
        name = _path_of(path)
        if name is None:
            return
        real = self.inside(name)
        target = _path_of(to) if to is not None else None
        real_to = self.inside(target) if target is not None else None
        if real is None and real_to is None:
            return
        event: Event = {"op": op, "path": real or name, "after_step": self.after_step}
        if target is not None:
            event["to"] = real_to or target
        event.update(extra)
        event["time_ns"] = time.time_ns()
        thread = threading.current_thread()
        if thread is not threading.main_thread():
            event["thread"] = thread.name
        for listener in self.listeners:
            listener(event)

    def _wrap(
        self,
        owner: Any,
        name: str,
        op: str,
        paths: Callable[..., tuple],
        extra: Optional[Callable[..., dict[str, Any]]] = None,
    ) -> None:
        """Replace `owner.name` with a function that logs `op` on `paths(*args, **kwargs)`
        ((path,) or (path, to), or () for nothing to log) after the call returns, with
        `extra(*args, **kwargs)` in the event: the event is what happened, not what was
        tried."""

        def logged(*args: Any, **kwargs: Any) -> None:
            try:
                found = paths(*args, **kwargs)
                more = extra(*args, **kwargs) if extra is not None else {}
            except Exception:  # naming is best effort: the call itself happened
                found, more = (), {}
            kept = getattr(self._kept, "path", None) if op in RENAMES else None
            if kept:
                more["replaced"] = kept
            if found:
                self.log(op, *found, **more)

        failed = self._failed(op, paths)
        before = self._before(op, paths)
        self._calls.wrap(owner, name, logged, before=before, sees_arguments=True, failed=failed)

    def _keep(self, op: str, found: tuple) -> None:
        """Before a rename (a power-loss crash launch): a hard link to the file it will
        replace, in `keep_into`, for the event to name."""
        self._kept.path = None
        if self.keep_into is None or op not in RENAMES or len(found) < 2:
            return
        target = _path_of(found[1])
        if target is None or self.inside(target) is None or not os.path.isfile(target):
            return
        with self._keep_lock:
            self._kept_count += 1
            number = self._kept_count
        kept = os.path.join(self.keep_into, f"{number}-{os.path.basename(target)}")
        try:
            with self._calls.unreported():  # the plugin's own link: no event
                os.makedirs(self.keep_into, mode=0o700, exist_ok=True)
                os.link(target, kept, follow_symlinks=False)
        except OSError:
            return
        self._kept.path = kept

    def _failed(self, op: str, paths: Callable[..., tuple]) -> Callable[..., None]:
        """What tags an exception out of `op` with the call, when it was on a path inside
        the watched folders: the rank's status file says it (`wrapping.failure_of`)."""

        def failed(exc: BaseException, *args: Any, **kwargs: Any) -> None:
            try:
                found = [_path_of(p) for p in paths(*args, **kwargs)]
            except Exception:
                return
            real = [self.inside(p) if p else None for p in found]
            if not any(real):
                return
            call = {"op": op, "path": real[0] or found[0], "after_step": self.after_step}
            if len(found) > 1:
                call["to"] = real[1] or found[1]
            if op == "open":
                call["mode"] = _mode(*args, **kwargs)
            call["error"] = f"{type(exc).__name__}: {exc}"
            tag_failure(exc, call)

        return failed

    def _opened(self, file: Any, *args: Any, **kwargs: Any) -> None:
        """An `open` returned: a write is an event, a read is kept in `reads`."""
        if _opened_for_writing(file, *args, **kwargs):
            self.log("open", file)
            return
        name = _path_of(file) if not isinstance(file, int) else None
        if name:
            self._opened_to_read.append(os.path.abspath(name))

    @property
    def reads(self) -> list[str]:
        """The last files inside the watched folders opened for reading, oldest first."""
        found: list[str] = []
        # a copy first: another thread (a background save) may open a file meanwhile, and a
        # deque changed while it is iterated raises; its C copy runs under the GIL whole
        for name in reversed(self._opened_to_read.copy()):
            real = self.inside(name)
            if real is not None and real not in found:
                found.insert(0, real)
            if len(found) == READS_KEPT:
                break
        return found

    def _before(self, op: str, paths: Callable[..., tuple]) -> Callable[..., None]:
        def before(*args: Any, **kwargs: Any) -> None:
            if op in RENAMES:
                try:
                    self._keep(op, paths(*args, **kwargs))
                except Exception:
                    self._kept.path = None
            if not self.before_listeners:
                return
            try:
                found = _path_of(next(iter(paths(*args, **kwargs)), None)) or ""
            except Exception:
                found = ""
            call = {"op": op, "path": found}
            for listener in self.before_listeners:
                listener(call)

        return before

    def install(self) -> None:
        """Wrap the calls that write files (the savers of torch, DCP and safetensors once
        imported: `after_import` of the restore log calls `install_savers`)."""
        named = self._failed, self._before
        failed, before = (
            f("open", lambda f, *a, **k: () if isinstance(f, int) else (f,)) for f in named
        )
        for owner in (builtins, io):
            self._calls.wrap(
                owner, "open", self._opened, before=before, sees_arguments=True, failed=failed
            )
        for name in ("replace", "rename", "link", "symlink"):
            self._wrap(os, name, f"os.{name}", lambda a, b, *r, **k: (a, b))
        for name in ("unlink", "remove", "rmdir"):
            self._wrap(os, name, f"os.{name}", lambda p, *r, **k: (p,))
        self._wrap(shutil, "rmtree", "shutil.rmtree", lambda p, *r, **k: (p,))
        self._wrap(os, "fsync", "os.fsync", lambda fd, *r, **k: _fd_path(fd), _synced)
        torch = sys.modules.get("torch")
        if torch is not None:
            self._wrap(torch, "save", "torch.save", lambda obj, f, *r, **k: (f,))

    def install_dcp(self, module: Any) -> None:
        for name in ("save", "async_save"):
            self._wrap(module, name, f"torch.distributed.checkpoint.{name}", _dcp_folder)

    def install_safetensors(self, module: Any) -> None:
        self._wrap(module, "save_file", "safetensors.torch.save_file", lambda t, f, *r, **k: (f,))

    def uninstall(self) -> None:
        self._calls.unwrap()


def _path_of(path: Any) -> Optional[str]:
    if isinstance(path, (str, bytes, os.PathLike)):
        name = os.fsdecode(path)
        return name if name else None
    return getattr(path, "name", None) if isinstance(getattr(path, "name", None), str) else None


def _mode(file: Any = None, mode: Any = "r", *args: Any, **kwargs: Any) -> str:
    mode = kwargs.get("mode", mode)
    return mode if isinstance(mode, str) else "r"


def _opened_for_writing(file: Any, *args: Any, **kwargs: Any) -> tuple:
    if isinstance(file, int) or not WRITE_MODES & set(_mode(file, *args, **kwargs)):
        return ()
    return (file,)


def _fd_path(fd: Any) -> tuple:
    fd = fd if isinstance(fd, int) else getattr(fd, "fileno", lambda: None)()
    try:
        return (os.readlink(f"/proc/self/fd/{fd}"),)
    except (OSError, TypeError):
        return ()


def _synced(fd: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """What an fsync made durable: a file's size then, or a folder's names."""
    fd = fd if isinstance(fd, int) else getattr(fd, "fileno", lambda: None)()
    try:
        found = os.fstat(fd)
    except (OSError, TypeError):
        return {}
    return {"folder": True} if stat.S_ISDIR(found.st_mode) else {"size": found.st_size}


def _dcp_folder(*args: Any, checkpoint_id: Any = None, storage_writer: Any = None, **kw: Any):
    path = checkpoint_id or getattr(storage_writer, "path", None)
    return (path,) if path is not None else ()
