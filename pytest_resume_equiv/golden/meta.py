"""A golden's metadata (`golden.json`): the format and its version, when and by which code it
was written (date, environment key, git commit when the store is in a git work tree), what it
holds (ranks, steps, checkpoints). Read as JSON only; a newer format is refused by name."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from .environment import Environment

GOLDEN_FORMAT = "pytest-resume-equiv/golden"
GOLDEN_VERSION = 1
META_FILE = "golden.json"


class GoldenError(Exception):
    """A golden that cannot be used: missing, corrupted, or of a newer format; the message
    names the file and what to do."""


@dataclass
class GoldenMeta:
    test: str
    """The test's node id."""
    environment: Environment
    world_size: int
    steps: int
    written: str = ""
    """When (UTC, ISO 8601)."""
    commit: str = ""
    """The git commit of the store's work tree when it was written ("" outside git)."""
    session: str = ""
    """The pytest session that wrote it (xdist workers of one session write a golden once)."""
    checkpoints: dict[int, str] = field(default_factory=dict)
    """split -> the checkpoint's path inside the golden (`golden_checkpoint=True`)."""
    version: int = GOLDEN_VERSION

    def written_by(self) -> str:
        """Which code wrote it, in words (a compatibility failure quotes it)."""
        commit = f", commit {self.commit}" if self.commit else ""
        return f"written {self.written} on {self.environment.key}{commit}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": GOLDEN_FORMAT,
            "version": self.version,
            "test": self.test,
            "environment": self.environment.to_json(),
            "world_size": self.world_size,
            "steps": self.steps,
            "written": self.written,
            "commit": self.commit,
            "session": self.session,
            "checkpoints": {str(k): v for k, v in sorted(self.checkpoints.items())},
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> GoldenMeta:
        if not isinstance(data, dict) or data.get("format") != GOLDEN_FORMAT:
            raise GoldenError(f"{where}: not a {GOLDEN_FORMAT} file")
        version = data.get("version")
        if not isinstance(version, int):
            raise GoldenError(f"{where}: no format version")
        if version > GOLDEN_VERSION:
            raise GoldenError(
                f"{where}: golden format version {version} is newer than this plugin's "
                f"({GOLDEN_VERSION}); upgrade pytest-resume-equiv to read it, or rewrite the "
                "golden with --resume-equiv-update-golden"
            )
        try:
            return cls(
                test=str(data["test"]),
                environment=Environment.from_json(data["environment"]),
                world_size=int(data["world_size"]),
                steps=int(data["steps"]),
                written=str(data.get("written", "")),
                commit=str(data.get("commit", "")),
                session=str(data.get("session", "")),
                checkpoints={int(k): str(v) for k, v in data.get("checkpoints", {}).items()},
                version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GoldenError(f"{where}: malformed golden metadata ({exc!r})") from None


def read_meta(golden_dir: str) -> GoldenMeta:
    path = os.path.join(golden_dir, META_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise GoldenError(f"{path}: missing (not a golden directory)") from None
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: unreadable ({exc})") from None
    return GoldenMeta.from_json(data, path)


def write_meta(golden_dir: str, meta: GoldenMeta) -> None:
    with open(os.path.join(golden_dir, META_FILE), "w", encoding="utf-8") as f:
        json.dump(meta.to_json(), f, indent=2, sort_keys=True)
        f.write("\n")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def git_commit(path: str) -> str:
    """HEAD of the git work tree holding `path` (with "-dirty" for uncommitted changes), or
    "" when it is not in one or git is missing."""
    try:
        head = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return head.stdout.strip()[:12] + ("-dirty" if dirty.stdout.strip() else "")


def session_token(config: Optional[Any] = None) -> str:
    """The id of this pytest session, the same in every xdist worker of it."""
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict) and workerinput.get("testrunuid"):
        return str(workerinput["testrunuid"])
    token = getattr(config, "_resume_equiv_session_token", None)
    if token is None:
        import uuid

        token = uuid.uuid4().hex
        if config is not None:
            config._resume_equiv_session_token = token
    return token
