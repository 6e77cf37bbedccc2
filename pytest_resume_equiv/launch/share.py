"""Uninterrupted launches shared by the tests of a session, across pytest-xdist workers too.

Two tests whose uninterrupted launch is the same (same target, arguments, environment, ranks,
device, seed, steps and splits) need it only once. Such a launch lives in a
directory named by that identity under the session's shared temporary directory; a file lock
beside it lets exactly one process run it while the others wait, and `launch.json` there holds
its result for every later test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable, Optional

from ..rank.launch_context import LaunchContext
from ..rank.run_dir import KEEP_FILE, RESULT_FILE
from .rank_exits import RankOutcome
from .running import LaunchResult, LaunchSpec, Target
from .spec import launcher_named
from .waiting import Wake

SHARED_DIR = "resume-equiv-shared"


def result_to_json(result: LaunchResult) -> dict:
    """A launch's result as JSON, for the tests that reuse it."""
    return dataclasses.asdict(result)


def result_from_json(data: dict) -> LaunchResult:
    spec = dict(data["spec"])
    target = spec.pop("target")
    spec["target"] = Target(
        target["kind"],
        target["name"],
        tuple(target.get("args", ())),
        tuple(target.get("pythonpath", ())),
    )
    spec["context"] = LaunchContext.from_json(json.dumps(spec.pop("context")))
    launcher = spec.pop("launcher", None) or {"name": "local"}
    spec["launcher"] = launcher_named(str(launcher["name"]), tuple(launcher.get("args", ())))
    spec["preload"] = tuple(spec.get("preload", ()))
    return LaunchResult(
        spec=LaunchSpec(**spec),
        returncodes=list(data["returncodes"]),
        timed_out=bool(data["timed_out"]),
        duration=float(data["duration"]),
        ranks=[RankOutcome(**r) for r in data["ranks"]],
        command=str(data["command"]),
        startup=float(data.get("startup", 0.0)),
        reused=str(data.get("reused") or data.get("owner") or ""),
        killed_after_step=int(data.get("killed_after_step", 0)),
        problem=str(data.get("problem", "")),
        note=str(data.get("note", "")),
    )


def load_result(run_dir: str) -> Optional[LaunchResult]:
    try:
        with open(os.path.join(run_dir, RESULT_FILE), encoding="utf-8") as f:
            return result_from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_result(run_dir: str, result: LaunchResult, owner: str) -> None:
    path = os.path.join(run_dir, RESULT_FILE)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump({**result_to_json(result), "owner": owner}, f)
    os.replace(f"{path}.tmp", path)


class SharedLaunch:
    """The scheduler's handle on a shared uninterrupted launch: runs it, or waits for and
    reuses it. Never gated: it reads no checkpoint."""

    gate_open = True

    def __init__(self, run_dir: str, start: Callable[[], object], owner: str) -> None:
        from filelock import FileLock

        self.run_dir = run_dir
        self._start = start
        self._owner = owner
        self._lock = FileLock(run_dir + ".lock")
        self._inner = None
        self.result: Optional[LaunchResult] = None
        self._begin()  # started now, before the launches the scheduler starts after it

    def open_gate(self) -> None:
        pass

    def _begin(self) -> None:
        """Take the launch's lock and reuse its stored result, or start it; or, while
        another test or xdist worker holds the lock, nothing yet."""
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return  # another test or xdist worker runs it now
        stored = load_result(self.run_dir)
        if stored is not None:
            self._lock.release()
            self.result = stored
            return
        try:
            shutil.rmtree(self.run_dir, ignore_errors=True)  # leftovers of a killed attempt
            os.makedirs(self.run_dir, mode=0o700)
            self._inner = self._start()
        except BaseException:
            self._lock.release()
            raise
        if self._inner is None:
            self._lock.release()

    def poll(self) -> Optional[LaunchResult]:
        if self.result is not None:
            return self.result
        if self._inner is None:
            self._begin()
            if self.result is not None or self._inner is None:
                return self.result
        result = self._inner.poll()
        if result is not None:
            save_result(self.run_dir, result, self._owner)
            self._lock.release()
            self.result = result
        return result

    def wake(self) -> Wake:
        """Its launch's processes, when this test runs it; else a look at the lock soon."""
        if self.result is not None:
            return Wake(at=0.0)
        inner_wake = getattr(self._inner, "wake", None)
        return inner_wake() if inner_wake is not None else Wake().soon()

    def kill(self) -> None:
        if self._inner is not None and self.result is None:
            try:
                self._inner.kill()
            finally:
                self._lock.release()
            self.result = None
            self._inner = None


def mark_kept(run_dir: str) -> None:
    try:
        with open(os.path.join(run_dir, KEEP_FILE), "w"):
            pass
    except OSError:
        pass


def clean_shared(root: str, keep: str) -> None:
    """At the end of the session: drop shared launches the keep policy does not keep."""
    if keep == "all" or not os.path.isdir(root):
        return
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            continue
        if keep == "failed" and os.path.exists(os.path.join(path, KEEP_FILE)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        try:
            os.remove(path + ".lock")
        except OSError:
            pass
    try:
        os.rmdir(root)
    except OSError:
        pass
