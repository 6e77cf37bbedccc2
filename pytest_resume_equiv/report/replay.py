"""What shaped a verdict, kept in the judged run directory (a resume's resumed run, an
equivalence test's variant): the check, the split, its label, the comparison rules (steps,
tolerance, ignore, strict-latent), the run directories it was compared with and, for an
equivalence test, how the report names both configurations. The offline
`python -m pytest_resume_equiv compare` reads it, so on the run directories a test kept it
gives that test's verdict and text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ..checks import Verdict
from ..compare.configurations import ConfigurationFacts
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
    """The run directories it was compared with, by role ("uninterrupted", "envelope",
    "baseline")."""
    names: dict[str, str] = field(default_factory=dict)
    """An equivalence test's configurations as its report names them, by role ("baseline",
    "variant"); empty for a resume."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": JUDGEMENT_FORMAT,
            "version": JUDGEMENT_VERSION,
            "check": self.check,
            "split": self.split,
            "label": self.label,
            "rules": to_json(self.rules),
            "runs": dict(self.runs),
            "names": dict(self.names),
        }


JUDGED_ROLES = ("resumed", "variant")
"""The role of the run a verdict judged, whose directory keeps its judgement."""


def judgement_of(verdict: Verdict, rules: ComparisonRules) -> Optional[tuple[str, Judgement]]:
    """(the judged run directory, its judgement) for a verdict that judged a run: a resume
    (its split), or an equivalence test's variant (against the baseline); None for any
    other."""
    role = next((r for r in JUDGED_ROLES if verdict.runs.get(r)), "")
    if not verdict.primary or not role or (role == "resumed" and verdict.split is None):
        return None
    found = next((f for f in verdict.facts if isinstance(f, ConfigurationFacts)), None)
    names = {"baseline": found.baseline, "variant": found.variant} if found else {}
    runs = {k: v for k, v in verdict.runs.items() if k != role}
    judgement = Judgement(verdict.check, verdict.split or 0, verdict.label, rules, runs, names)
    return verdict.runs[role], judgement


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
            names={str(k): str(v) for k, v in data.get("names", {}).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise JudgementError(f"{path}: malformed judgement ({exc!r})") from None
