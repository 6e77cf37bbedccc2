"""The plugin's state for one pytest session, in one object (as pytest-xdist's `DSession` or
syrupy's `SnapshotSession`): the resolved options, the session's folder in the keep directory
(where run directories and shared uninterrupted launches live: `launch/keep_dir.py`), the
records of the resume tests, and the tests launching right now.

Under pytest-xdist every worker has its own, and the controller's session folder (handed in
its `workerinput`); at the end a worker hands its records and its shared directory to the
controller, which writes the one JSON report and cleans up.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional

import pytest

from .compare.jsonable import from_json, to_json
from .errors import ResumeEquivWarning, SettingError
from .fixtures import ResumeEquiv
from .golden import GoldenStore, GoldenTarget, current
from .golden.meta import session_token
from .launch.devices import Device
from .launch.keep_dir import SessionFolder, default_keep_dir, new_session_id, prune
from .launch.share import SHARED_DIR, clean_shared, mark_kept
from .report.drawer import Drawer
from .report.records import TestRecord, report_json
from .settings import SessionSettings, TestSettings, resolve_session

WORKER_RECORDS = "resume_equiv_tests"
WORKER_SHARED = "resume_equiv_shared"
WORKER_COLLECTED = "resume_equiv_collected"
"""Keys of a pytest-xdist worker's `workeroutput`."""
WORKER_FOLDER = "resume_equiv_session_folder"
"""Key of a pytest-xdist worker's `workerinput`: the controller's session folder."""


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def session_temp(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """pytest's base temporary directory of the whole session: a pytest-xdist worker's lies
    inside the controller's, so all workers share the parent."""
    base = factory.getbasetemp()
    return base.parent if is_xdist_worker(config) else base


def narrowed_files(config: Any) -> list[str]:
    """Test files the command line narrowed to some of their tests (`path::test`), relative
    to the rootdir as node ids are: their other tests were not collected, not removed."""
    root = str(getattr(config, "rootpath", "") or os.getcwd())
    args = getattr(config, "args", None) or []
    return [
        os.path.relpath(os.path.abspath(arg.split("::")[0]), root).replace(os.sep, "/")
        for arg in args
        if "::" in str(arg)
    ]


class ResumeEquivSession:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings: SessionSettings = resolve_session(config)
        self.records: list[TestRecord] = []
        self.launching: dict[str, ResumeEquiv] = {}
        """node id -> the fixture of every resume test whose launches run now."""
        self.shared_root: Optional[str] = None
        self.collected: set[str] = set()
        """Node ids of the resume tests collected (selected or not): they use their goldens."""
        self.unused: list[str] = []
        """Goldens of tests no longer collected (found at the end, with a store)."""
        self.folder = SessionFolder(self._folder_path())
        """Where this session's run directories live (the controller's under pytest-xdist)."""
        self.unkept: Optional[str] = None
        """Why run directories live in pytest's temporary directory instead (the default keep
        directory could not be made: a read-only checkout), or None."""
        self.kept_in: Optional[str] = None
        """The session folder, when it holds kept run directories at the end."""
        self.drawer = Drawer()
        """Draws the failed tests' pictures beside the next tests (`report/drawer.py`)."""

    def _folder_path(self) -> str:
        given = getattr(self.config, "workerinput", {}).get(WORKER_FOLDER)
        if given:
            return str(given)
        keep_dir = self.settings["keep_dir"] or default_keep_dir(str(self.config.rootpath))
        return os.path.join(os.path.abspath(keep_dir), new_session_id())

    def for_worker(self, workerinput: dict[str, Any]) -> None:
        """pytest-xdist controller: a worker starts; it uses this session's folder."""
        workerinput[WORKER_FOLDER] = self.folder.path

    def run_root(self, name: str, factory: pytest.TempPathFactory) -> str:
        """A fresh private (0700) directory for one test's launches, in the session folder."""
        if self.unkept is None:
            try:
                return self.folder.new_run_root(name)
            except OSError as exc:
                self._cannot_keep(exc)
        base = factory.getbasetemp()
        return tempfile.mkdtemp(prefix=f"resume-equiv-{name}-", dir=base)

    def shared_dir(self, factory: pytest.TempPathFactory) -> str:
        """The directory of uninterrupted launches shared by the session's tests."""
        if self.shared_root is None and self.unkept is None:
            try:
                self.shared_root = self.folder.new_shared()
            except OSError as exc:
                self._cannot_keep(exc)
        if self.shared_root is None:
            path = session_temp(self.config, factory) / SHARED_DIR
            path.mkdir(mode=0o700, exist_ok=True)
            self.shared_root = str(path)
        return self.shared_root

    def _cannot_keep(self, exc: OSError) -> None:
        """The keep directory cannot be made: an error when an option named it; the default
        falls back to pytest's temporary directory, with a warning."""
        source = self.settings.values["keep_dir"].source
        where = self.folder.keep_dir
        if source != "default":
            raise SettingError(
                f"pytest-resume-equiv: cannot make the keep directory {where} (keep_dir from "
                f"{source}): {exc}"
            )
        self.unkept = f"{where} cannot be made ({exc})"
        warnings.warn(
            ResumeEquivWarning(
                f"run directories stay in pytest's temporary directory, which later pytest "
                f"sessions delete: {self.unkept}; set --resume-equiv-keep-dir"
            ),
            stacklevel=3,
        )

    def golden_for(
        self, test: str, settings: TestSettings, device: Device
    ) -> Optional[GoldenTarget]:
        """What `test` asks of the golden store, or None without one."""
        if settings.golden is None:
            return None
        marker = settings.marker
        devices = 0 if device.kind == "cpu" else marker.world_size
        return GoldenTarget(
            GoldenStore(settings.golden),
            test,
            current(device.kind, marker.world_size, devices),
            update=settings.update_golden,
            only=settings.golden_only,
            session=session_token(self.config),
        )

    def test_done(self, fixture: ResumeEquiv, failed: bool) -> TestRecord:
        """A resume test ended: keep its record; a failed or interrupted one keeps the shared
        launches it used."""
        self.launching.pop(fixture.owner, None)
        if failed or fixture.launching:
            for path in fixture.shared_dirs:
                mark_kept(path)
        record = fixture.record(failed or fixture.launching)
        self.records.append(record)
        return record

    def interrupted(self) -> list[str]:
        """Ctrl-C or SIGTERM: where the partial run directories of the tests stopped
        mid-launch are (kept; the cleanup of shared launches spares them), and what those
        tests had found ("test: interrupted after: split 3: ..."): a divergence already seen
        is not lost in the interruption."""
        paths: list[str] = []
        found: list[str] = []
        for fixture in self.launching.values():
            if not fixture.launching:
                continue
            for path in fixture.shared_dirs:
                mark_kept(path)
            paths += [p for p in (fixture.root.path, *fixture.shared_dirs) if os.path.isdir(p)]
            failures = [run.failure for run in fixture.runs[-1:]]
            found += [
                f"{fixture.owner}: {f}" for f in failures if f.startswith("interrupted after")
            ]
        kept = "interrupted; every launch was killed; partial run directories kept: "
        return ([kept + ", ".join(paths)] if paths else []) + found

    def worker_done(self, output: dict[str, Any]) -> None:
        """pytest-xdist controller: a worker's records, and where it shared its launches."""
        self.records += [
            from_json(TestRecord, data, "a pytest-xdist worker's record")
            for data in output.get(WORKER_RECORDS, [])
        ]
        self.shared_root = output.get(WORKER_SHARED) or self.shared_root
        self.collected |= set(output.get(WORKER_COLLECTED, []))

    def finish(self) -> None:
        """Every picture a failure named is drawn, then the session is handed over."""
        self.drawer.finish()
        try:
            self._hand_over()
        finally:  # warned last: under `-W error` a warning raises here
            for failed in self.drawer.failed:
                text = f"a failure's plot could not be drawn: {failed}"
                warnings.warn(ResumeEquivWarning(text), stacklevel=2)

    def _hand_over(self) -> None:
        """A worker hands everything to the controller; the controller (or a session without
        xdist) removes the shared launches nobody keeps and writes the JSON report."""
        if is_xdist_worker(self.config):
            output = self.config.workeroutput  # type: ignore[attr-defined]
            output[WORKER_RECORDS] = [to_json(r) for r in self.records]
            output[WORKER_SHARED] = self.shared_root
            output[WORKER_COLLECTED] = sorted(self.collected)
            return
        if self.shared_root and not self.settings.error:
            clean_shared(self.shared_root, self.settings["keep"])
        self._finish_folder()
        if self.settings.error:
            return
        self._unused_goldens()
        path = self.settings["report"]
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(report_json(self.records), f, indent=2)

    def _finish_folder(self) -> None:
        """The session folder goes when nothing in it is kept; a session that used the keep
        directory bounds it (the newest sessions that kept anything stay)."""
        if not os.path.isdir(self.folder.path):
            return
        self.kept_in = self.folder.finish()
        prune(self.folder.keep_dir, os.path.basename(self.folder.path))

    def _unused_goldens(self) -> None:
        """The goldens no collected test uses; an update run removes them."""
        root = self.settings["golden"]
        if root is None or not self.collected:
            return
        store = GoldenStore(root)
        self.unused = store.unused(self.collected, narrowed_files(self.config))
        if self.settings["update_golden"]:
            for test in self.unused:
                store.remove(test)
