"""The plugin's state for one pytest session, in one object (as pytest-xdist's `DSession` or
syrupy's `SnapshotSession`): the resolved options, where shared uninterrupted launches live,
the records of the resume tests, and the tests launching right now.

Under pytest-xdist every worker has its own; at the end a worker hands its records and its
shared directory to the controller, which writes the one JSON report and cleans up.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import pytest

from .fixtures import ResumeEquiv
from .records import TestRecord, report_json
from .settings import SessionSettings, resolve_session
from .share import SHARED_DIR, clean_shared, mark_kept

WORKER_RECORDS = "resume_equiv_tests"
WORKER_SHARED = "resume_equiv_shared"
"""Keys of a pytest-xdist worker's `workeroutput`."""


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def session_temp(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """pytest's base temporary directory of the whole session: a pytest-xdist worker's lies
    inside the controller's, so all workers share the parent."""
    base = factory.getbasetemp()
    return base.parent if is_xdist_worker(config) else base


class ResumeEquivSession:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings: SessionSettings = resolve_session(config)
        self.records: list[TestRecord] = []
        self.launching: dict[str, ResumeEquiv] = {}
        """node id -> the fixture of every resume test whose launches run now."""
        self.shared_root: Optional[str] = None

    def shared_dir(self, factory: pytest.TempPathFactory) -> str:
        """The directory of uninterrupted launches shared by the session's tests."""
        if self.shared_root is None:
            path = session_temp(self.config, factory) / SHARED_DIR
            path.mkdir(mode=0o700, exist_ok=True)
            self.shared_root = str(path)
        return self.shared_root

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
        """Ctrl-C or SIGTERM: the partial run directories of the tests stopped mid-launch
        (kept; the cleanup of shared launches spares them)."""
        paths: list[str] = []
        for fixture in self.launching.values():
            if not fixture.launching:
                continue
            for path in fixture.shared_dirs:
                mark_kept(path)
            paths += [p for p in (fixture.root.path, *fixture.shared_dirs) if os.path.isdir(p)]
        return paths

    def worker_done(self, output: dict[str, Any]) -> None:
        """pytest-xdist controller: a worker's records, and where it shared its launches."""
        self.records += [TestRecord.from_json(data) for data in output.get(WORKER_RECORDS, [])]
        self.shared_root = output.get(WORKER_SHARED) or self.shared_root

    def finish(self) -> None:
        """A worker hands everything to the controller; the controller (or a session without
        xdist) removes the shared launches nobody keeps and writes the JSON report."""
        if is_xdist_worker(self.config):
            output = self.config.workeroutput  # type: ignore[attr-defined]
            output[WORKER_RECORDS] = [r.to_json() for r in self.records]
            output[WORKER_SHARED] = self.shared_root
            return
        if self.settings.error:
            return
        if self.shared_root:
            clean_shared(self.shared_root, self.settings["keep"])
        path = self.settings["report"]
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(report_json(self.records), f, indent=2)
