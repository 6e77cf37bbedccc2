"""The golden store: `DIR/<test id>/<environment key>/` per resume test and environment, each
holding the uninterrupted run's signatures (`signatures/rank-<R>.jsonl`, text a reviewer reads
in a diff), `golden.json` (metadata) and, with `golden_checkpoint=True`, the checkpoint saved
at each split (`checkpoints/split-<S>/`).

Writes are atomic: a golden is built in a temporary directory beside its place and renamed
into it; the golden it replaces is first moved aside and restored on the next access if the
update was killed between the two renames, so a killed update leaves the previous golden
intact. Two pytest-xdist workers never write the same golden: an exclusive lock file guards
each golden, and a golden already written by this session is not written again.

Only JSON is read here; stored checkpoints are copied, never opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Optional

from ..rank.run_dir import signature_path
from .meta import META_FILE, GoldenError, GoldenMeta, read_meta, write_meta

ASIDE = ".previous"
"""Suffix of a golden moved aside while its replacement is renamed into place."""
LOCK = ".lock"
TEMP = ".tmp-"
TEST_FILE = "test.txt"
"""The test's node id, written in its folder (the folder name is a sanitized form)."""


def folder_name(test_id: str) -> str:
    """A test's folder name: its node id with every character a file system or a shell may
    mind replaced (`tests/test_a.py::test_b[x-1]` -> `tests_test_a.py__test_b_x-1_`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", test_id).strip(".") or "_"


@dataclass(frozen=True)
class Golden:
    """One stored golden: where it is and its metadata."""

    path: str
    meta: GoldenMeta

    def checkpoint(self, split: int) -> Optional[str]:
        rel = self.meta.checkpoints.get(split)
        return os.path.join(self.path, rel) if rel else None

    def size(self, split: int) -> int:
        path = self.checkpoint(split)
        return tree_size(path) if path else 0


def tree_size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def size_words(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} bytes"


class GoldenStore:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def test_dir(self, test_id: str) -> str:
        return os.path.join(self.root, folder_name(test_id))

    def path(self, test_id: str, key: str) -> str:
        return os.path.join(self.test_dir(test_id), key)

    # reading

    def keys(self, test_id: str) -> list[str]:
        """The environment keys this test has goldens for."""
        folder = self.test_dir(test_id)
        if not os.path.isdir(folder):
            return []
        for name in os.listdir(folder):
            if name.endswith(ASIDE):
                _recover(os.path.join(folder, name[: -len(ASIDE)]))
        return sorted(
            n
            for n in os.listdir(folder)
            if not n.startswith(".") and os.path.isfile(os.path.join(folder, n, META_FILE))
        )

    def load(self, test_id: str, key: str) -> Optional[Golden]:
        """The golden of `test_id` for `key`, or None when there is none; GoldenError when
        there is one that cannot be used."""
        path = self.path(test_id, key)
        _recover(path)
        if not os.path.isdir(path):
            return None
        return Golden(path, read_meta(path))

    def missing_text(self, test_id: str, key: str) -> str:
        have = ", ".join(self.keys(test_id)) or "none"
        return f"no golden for {key} (have: {have}); run with --resume-equiv-update-golden"

    # writing

    def write(
        self,
        meta: GoldenMeta,
        signatures_of: str,
        checkpoints: Optional[dict[int, str]] = None,
    ) -> Optional[Golden]:
        """Store the signatures of the run in `signatures_of` (and the checkpoints, split ->
        path) as the golden of `meta.test` for its environment, atomically. None when this
        session (another xdist worker) already wrote it."""
        key = meta.environment.key
        target = self.path(meta.test, key)
        folder = os.path.dirname(target)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, TEST_FILE), "w", encoding="utf-8") as f:
            f.write(meta.test + "\n")
        with exclusive(os.path.join(folder, f".{key}{LOCK}")):
            try:
                current = self.load(meta.test, key)  # puts back one a killed update moved aside
            except GoldenError:
                current = None  # unreadable or newer: an update replaces it
            if current is not None and meta.session and current.meta.session == meta.session:
                return None
            temp = tempfile.mkdtemp(prefix=f".{key}{TEMP}", dir=folder)
            try:
                meta.checkpoints = _fill(temp, signatures_of, meta.world_size, checkpoints or {})
                write_meta(temp, meta)
                _replace(temp, target)
            finally:
                shutil.rmtree(temp, ignore_errors=True)
        return Golden(target, meta)

    def remove(self, test_id: str, key: Optional[str] = None) -> None:
        """Remove one golden, or every golden of a test (`key` None)."""
        path = self.test_dir(test_id) if key is None else self.path(test_id, key)
        shutil.rmtree(path, ignore_errors=True)

    # unused goldens

    def tests(self) -> dict[str, str]:
        """Every test the store has goldens for: folder -> node id."""
        found: dict[str, str] = {}
        if not os.path.isdir(self.root):
            return found
        for name in sorted(os.listdir(self.root)):
            folder = os.path.join(self.root, name)
            if name.startswith(".") or not os.path.isdir(folder):
                continue
            try:
                with open(os.path.join(folder, TEST_FILE), encoding="utf-8") as f:
                    found[name] = f.read().strip()
            except OSError:
                continue  # not a test's folder (a README, the user's own files)
        return found

    def unused(self, collected: Iterable[str], narrowed: Iterable[str] = ()) -> list[str]:
        """Goldens of tests that were not collected, among the test files that were (a
        session that collected one file says nothing of the others' goldens) and were not
        narrowed to some of their tests by node ids on the command line (`narrowed`): their
        node ids."""
        collected = set(collected)
        files = {test.split("::")[0] for test in collected} - set(narrowed)
        return [
            test
            for test in self.tests().values()
            if test not in collected and test.split("::")[0] in files
        ]


def _fill(temp: str, run_dir: str, world_size: int, checkpoints: dict[int, str]) -> dict[int, str]:
    """Copy the signatures and checkpoints into `temp`; where each checkpoint went."""
    for rank in range(world_size):
        source = signature_path(run_dir, rank)
        if not os.path.isfile(source):
            raise GoldenError(f"{source}: missing, so no golden can be written from {run_dir}")
        dest = signature_path(temp, rank)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        _copy_signature(source, dest)
    stored: dict[int, str] = {}
    for split, source in sorted(checkpoints.items()):
        rel = os.path.join("checkpoints", f"split-{split}")
        dest = os.path.join(temp, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.isdir(source):
            shutil.copytree(source, dest, symlinks=True)
        else:
            shutil.copyfile(source, dest)
        stored[split] = rel
    return stored


VOLATILE = ("pid", "node")
"""Header fields that change from run to run without the numbers changing: left out of a
golden, so an update that changes nothing shows no diff."""


def _copy_signature(source: str, dest: str) -> None:
    with open(source, encoding="utf-8") as f:
        header, rest = f.readline(), f.read()
    try:
        fields = json.loads(header)
    except ValueError:
        raise GoldenError(f"{source}: line 1 is not JSON, so no golden is written") from None
    if isinstance(fields, dict):
        kept = {k: v for k, v in fields.items() if k not in VOLATILE}
        header = json.dumps(kept, sort_keys=True, separators=(",", ":")) + "\n"
    with open(dest, "w", encoding="utf-8") as f:
        f.write(header + rest)


def _replace(temp: str, target: str) -> None:
    """Rename `temp` into `target`; a golden already there is moved aside first, and removed
    only once the new one is in place."""
    aside = target + ASIDE
    shutil.rmtree(aside, ignore_errors=True)
    if os.path.isdir(target):
        os.rename(target, aside)
    os.rename(temp, target)
    shutil.rmtree(aside, ignore_errors=True)


def _recover(target: str) -> None:
    """An update killed between its two renames left the previous golden aside: put it back."""
    aside = target + ASIDE
    if os.path.isdir(aside) and not os.path.exists(target):
        with contextlib.suppress(OSError):
            os.rename(aside, target)


@contextlib.contextmanager
def exclusive(path: str, timeout: float = 600.0) -> Iterator[None]:
    """Hold `path` as a lock file (created exclusively; its holder's pid inside). A lock left
    by a process that is gone is taken over."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            break
        except FileExistsError:
            if _stale(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            if time.monotonic() > deadline:
                raise GoldenError(f"{path}: held for {timeout:.0f}s by another writer") from None
            time.sleep(0.05)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _stale(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        return False  # being written right now
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
