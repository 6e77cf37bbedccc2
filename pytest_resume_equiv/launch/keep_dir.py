"""Where run directories live, so that the kept ones outlast later pytest sessions.

pytest keeps three numbered base temporary directories and deletes older ones at the end of
every session of the user, whatever its project: run directories kept there were gone within
minutes, and the report's "rerun by hand" lines pointed at nothing. Run directories live in
the keep directory instead (`--resume-equiv-keep-dir`, default `<rootdir>/.resume-equiv/runs`),
one folder per pytest session, `<keep dir>/<session id>/`: a sortable UTC timestamp and the
pid of the process that owns the session (pytest-xdist's controller), which every worker is
handed. In it: a private directory per test, `shared/` (uninterrupted launches shared by the
session's tests) and `owner` (host and pid). At the session's end the folder goes when nothing
in it is kept, and the keep directory keeps only the newest `KEEP_SESSIONS` folders that hold
anything.

Nothing here imports pytest.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import shutil
import socket
import tempfile
import time
from typing import Optional

KEEP_SESSIONS = 5
"""Session folders that hold something and stay in the keep directory (the newest)."""
OTHER_HOST_GRACE = 24 * 3600.0
"""A folder owned by a session of another host (a keep directory on a shared filesystem) is
spared this long: its owner cannot be asked whether it still runs."""
OWNER_FILE = "owner"
SHARED = "shared"
GITIGNORE = (
    "# Created by pytest-resume-equiv: run directories of resume tests; delete this folder to "
    "clean it.\n*\n"
)
SESSION_NAME = re.compile(r"(\d{8}-\d{6})-(\d+)")
"""A session folder's name: `20250102-030405-4242` (UTC time, the owner's pid)."""


def default_keep_dir(rootdir: str) -> str:
    return os.path.join(rootdir, ".resume-equiv", "runs")


def new_session_id(now: Optional[float] = None, pid: Optional[int] = None) -> str:
    """A session's folder name: sorts by start time (UTC), unique by the owner's pid."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.getpid() if pid is None else pid}"


def make_private_dirs(path: str) -> None:
    """`path` and its missing parents, each 0700; the topmost one made gets a `.gitignore`
    holding `*` (as pytest's cache does), so a repository never commits run directories."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    made = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
            made.append(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
    if made:
        try:
            with open(os.path.join(made[0], ".gitignore"), "x", encoding="utf-8") as f:
                f.write(GITIGNORE)
        except FileExistsError:
            pass


class SessionFolder:
    """One pytest session's folder in the keep directory, made on first use."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def keep_dir(self) -> str:
        return os.path.dirname(self.path)

    @property
    def shared(self) -> str:
        return os.path.join(self.path, SHARED)

    def create(self) -> None:
        """Make the folder (and the keep directory) and write its owner: the pid in its name,
        on this host. Every pytest-xdist worker may do it; the first one writes the owner."""
        if os.path.isdir(self.path):
            return
        make_private_dirs(self.keep_dir)
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            pass  # another pytest-xdist worker made it
        match = SESSION_NAME.fullmatch(os.path.basename(self.path))
        owner = {"host": socket.gethostname(), "pid": int(match.group(2)) if match else 0}
        try:
            with open(os.path.join(self.path, OWNER_FILE), "x", encoding="utf-8") as f:
                json.dump(owner, f)
        except FileExistsError:
            pass

    def new_run_root(self, name: str) -> str:
        """A fresh private (0700) directory for one test's launches."""
        self.create()
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.path)

    def new_shared(self) -> str:
        self.create()
        os.makedirs(self.shared, mode=0o700, exist_ok=True)
        return self.shared

    def finish(self) -> Optional[str]:
        """The session ended: remove the folder when nothing in it is kept. Returns its path
        when it stays."""
        if not os.path.isdir(self.path):
            return None
        if holds_anything(self.path):
            return self.path
        shutil.rmtree(self.path, ignore_errors=True)
        return None


def holds_anything(folder: str) -> bool:
    try:
        return any(name != OWNER_FILE for name in os.listdir(folder))
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OSError:
        return False
    return True


def _owner_may_run(folder: str, host: str, now: float) -> bool:
    """Whether the session owning `folder` may still run. A folder without a readable owner
    is not known to be one of ours (or is being made): it may."""
    try:
        with open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as f:
            owner = json.load(f)
        pid, where = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return True
    if where != host:
        started = calendar.timegm(time.strptime(os.path.basename(folder)[:15], "%Y%m%d-%H%M%S"))
        return now - started < OTHER_HOST_GRACE
    return pid_alive(pid)


def prune(
    keep_dir: str,
    current: str,
    keep: int = KEEP_SESSIONS,
    host: Optional[str] = None,
    now: Optional[float] = None,
) -> list[str]:
    """Remove the session folders older than the newest `keep` that hold anything, and the
    empty ones. Never the `current` session's, one whose owner still runs on this host, one
    of another host younger than `OTHER_HOST_GRACE`, nor anything not named and owned as
    `SessionFolder` makes them: a keep directory pointed at a busy place loses nothing else.
    Returns the folders removed."""
    try:
        names = sorted(os.listdir(keep_dir))
    except OSError:
        return []
    sessions = [
        name
        for name in names
        if SESSION_NAME.fullmatch(name) and os.path.isdir(os.path.join(keep_dir, name))
    ]
    holding = [name for name in sessions if holds_anything(os.path.join(keep_dir, name))]
    spared = {*holding[max(0, len(holding) - keep) :], current}
    host = socket.gethostname() if host is None else host
    now = time.time() if now is None else now
    removed = []
    for name in sessions:
        folder = os.path.join(keep_dir, name)
        if name in spared or _owner_may_run(folder, host, now):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def kept_line(folder: str, keep: str, interrupted: bool = False) -> str:
    """The terminal summary's line when the session's folder stays (`interrupted`: a test was
    stopped by Ctrl-C or SIGTERM mid-launch; its partial directories stay too)."""
    tests = "failed and interrupted tests" if interrupted else "failed tests"
    what = f"run directories of {tests}" if keep == "failed" else "run directories"
    return (
        f"resume-equiv: {what} kept in {folder} (the last {KEEP_SESSIONS} sessions are kept; "
        f"delete {os.path.dirname(folder)} to clean)"
    )
