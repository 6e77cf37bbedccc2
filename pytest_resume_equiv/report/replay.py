"""What shaped a resume's verdict, kept in the resumed run directory: the check, the split,
its label, the comparison rules (steps, tolerance, ignore, strict-latent) and the run
directories it was compared with. The offline `python -m pytest_resume_equiv compare` reads
it, so on the run directories a test kept it gives that test's verdict and text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ..compare.jsonable import from_json, to_json
from ..compare.tolerance import ComparisonRules

JUDGEMENT_FILE = "judgement.json"
JUDGEMENT_FORMAT = "pytest-resume-equiv/judgement"
JUDGEMENT_VERSION = 1


class JudgementError(ValueError):
    """A judgement file that cannot be read (another format, a newer version, bad JSON)."""


@dataclass(frozen=True)
class Judgement:
    check: str
    split: int
    label: str
    rules: ComparisonRules
    runs: dict[str, str] = field(default_factory=dict)
    """The run directories it was compared with, by role ("uninterrupted", "envelope")."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": JUDGEMENT_FORMAT,
            "version": JUDGEMENT_VERSION,
            "check": self.check,
            "split": self.split,
            "label": self.label,
            "rules": to_json(self.rules),
            "runs": dict(self.runs),
        }


def judgement_path(run_dir: str) -> str:
    return os.path.join(run_dir, JUDGEMENT_FILE)


def write_judgement(run_dir: str, judgement: Judgement) -> None:
    """Atomically, beside the resumed run's signatures (a run directory that is gone, or was
    never made, gets none: there is nothing to judge offline)."""
    if not os.path.isdir(run_dir):
        return
    path = judgement_path(run_dir)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(judgement.to_json(), f, indent=1, sort_keys=True)
    os.replace(f"{path}.tmp", path)


def read_judgement(run_dir: str) -> Optional[Judgement]:
    """The judgement a test left in `run_dir`, or None when it has none (a run directory
    of an older version, or one made by hand)."""
    path = judgement_path(run_dir)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JudgementError(f"{path}: unreadable judgement ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != JUDGEMENT_FORMAT:
        raise JudgementError(f"{path}: not a {JUDGEMENT_FORMAT} file")
    if data.get("version") != JUDGEMENT_VERSION:
        raise JudgementError(
            f"{path}: judgement version {data.get('version')!r} is not one this plugin reads "
            f"({JUDGEMENT_VERSION}); compare with the pytest-resume-equiv version that wrote it"
        )
    try:
        return Judgement(
            check=str(data["check"]),
            split=int(data["split"]),
            label=str(data["label"]),
            rules=from_json(ComparisonRules, data["rules"], f"{path}: rules"),
            runs={str(k): str(v) for k, v in data.get("runs", {}).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise JudgementError(f"{path}: malformed judgement ({exc!r})") from None
