"""Read and validate signature files (JSON lines written by `rank/record.py`, laid out as
`rank/layout.py` declares them).

Only JSON is read back; nothing here unpickles. Every problem is raised as a
`SignatureError` that names the file and line, so a corrupted run is a clear failure.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .rank.encode import decode_float
from .rank.layout import (
    AUTO,
    AUTOMATIC,
    COUNTERS,
    END,
    FILE_EVENT,
    FLOAT_TAG,
    IGNORED,
    LOADED,
    PREFLIGHT,
    READABLE_SIGNATURE_VERSIONS,
    RESTORE,
    RESUME_POINT,
    SIGNATURE_FORMAT,
    STEP,
    TENSOR_TAG,
    VALUES,
    audit_key,
    line_kind,
    section_names,
)
from .rank.run_dir import signature_path


class SignatureError(Exception):
    """A signature file is missing, corrupted, or of a format this plugin cannot read."""


@dataclass
class Signature:
    path: str
    header: dict[str, Any]
    steps: list[tuple[int, dict[str, Any]]]
    """(step, values) in the order recorded; duplicates and disorder are kept for the checks."""
    complete: bool
    """The footer was written: the rank finished recording and closed the file."""
    truncated_tail: bool = False
    restores: list[dict[str, Any]] = field(default_factory=list)
    """The restore log: every call that restored state, in order (rank/restore.py)."""
    resume_points: list[dict[str, Any]] = field(default_factory=list)
    """Snapshots at the resume point: one in a resumed run, one per split in the
    uninterrupted run (rank/resume_point.py)."""
    ignored: list[str] = field(default_factory=list)
    """Audit names the trainer left out on purpose (`track(..., ignore=True)`)."""
    preflight: Optional[dict[str, Any]] = None
    """The determinism knobs as the training set them (rank/preflight.py)."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The file events, in order (rank/files.py)."""
    counters: dict[int, dict[str, int]] = field(default_factory=dict)
    """Step -> the step counters after it (automatic recording; not compared)."""
    found: list[str] = field(default_factory=list)
    """The watched objects automatic recording found itself (`model`, `optimizer`, ...)."""
    loaded: Optional[dict[str, Any]] = None
    """A resumed launch with automatic recording: the step counters its load restored
    (`{"split": N, "counters": {"optimizer": 3, "lr_scheduler": 3}}`, rank/auto.py)."""
    automatic: int = 0
    """Of `steps`, the last ones automatic recording wrote with no `record` call since the
    trainer's last one (superseded by its next: layout.AUTOMATIC)."""

    def resume_point(self, split: int) -> Optional[dict[str, Any]]:
        return next((p for p in self.resume_points if p.get("split") == split), None)

    @property
    def rank(self) -> int:
        return int(self.header["rank"])

    def by_step(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for step, values in self.steps:
            out.setdefault(step, values)
        return out


def read_signature(path: str) -> Signature:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SignatureError(f"{path}: no signature file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SignatureError(f"{path}: unreadable ({exc})") from None
    lines = text.split("\n")
    truncated = bool(lines and lines[-1])  # a rank killed mid-write leaves no final newline
    if not truncated:
        lines = lines[:-1]
    if not lines or not lines[0]:
        raise SignatureError(f"{path}: empty signature file (the rank died before writing it)")
    signature = Signature(path, _header(path, lines[0]), [], False, truncated_tail=truncated)
    body = lines[1:-1] if truncated else lines[1:]
    # the unfinished last line of a killed rank is dropped: the prefix before it stands
    for offset, line in enumerate(body):
        _read_line(signature, offset + 2, line)
    return signature


def _header(path: str, line: str) -> dict[str, Any]:
    header = _parse(path, 1, line)
    if header.get("format") != SIGNATURE_FORMAT:
        raise SignatureError(
            f"{path}: line 1 is not a {SIGNATURE_FORMAT} header (format={header.get('format')!r})"
        )
    if header.get("version") not in READABLE_SIGNATURE_VERSIONS:
        readable = ", ".join(map(str, READABLE_SIGNATURE_VERSIONS))
        raise SignatureError(
            f"{path}: signature format version {header.get('version')!r} is not one this plugin "
            f"reads (it reads versions {readable}); compare runs made by the same "
            "pytest-resume-equiv version"
        )
    for key in ("rank", "world_size", "phase"):
        if key not in header:
            raise SignatureError(f"{path}: header has no {key!r}")
    return header


def _read_line(signature: Signature, lineno: int, line: str) -> None:
    path = signature.path
    obj = _parse(path, lineno, line)
    kind = line_kind(obj)
    if kind == END:
        signature.complete = True
        footer = obj.get(END)
        found = footer.get("found") if isinstance(footer, dict) else None
        if isinstance(found, list):
            signature.found = [str(name) for name in found]
    elif kind == RESTORE:
        signature.restores.append(_object(path, lineno, obj, RESTORE))
    elif kind == RESUME_POINT:
        signature.resume_points.append(_object(path, lineno, obj, RESUME_POINT))
    elif kind == IGNORED:
        signature.ignored += [str(name) for name in obj[IGNORED]]
    elif kind == PREFLIGHT:
        signature.preflight = _object(path, lineno, obj, PREFLIGHT)
    elif kind == LOADED:
        signature.loaded = _object(path, lineno, obj, LOADED)
    elif kind == FILE_EVENT:
        signature.files.append(_object(path, lineno, obj, FILE_EVENT))
    else:
        step, values = obj.get(STEP), obj.get(VALUES)
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(values, dict):
            raise SignatureError(f"{path}: line {lineno} is not a step record: {line[:120]}")
        # the automatic sections beside the user's keys (identifiers: they cannot collide)
        for section in section_names():
            entries = _object(path, lineno, obj, section, {})
            values.update({audit_key(section, k): v for k, v in entries.items()})
        if obj.get(AUTOMATIC) is True:
            signature.automatic += 1
        elif signature.automatic:
            _supersede(signature, values)
        signature.steps.append((step, values))
        counters = obj.get(COUNTERS)
        if isinstance(counters, dict):
            signature.counters.setdefault(step, counters)


def _supersede(signature: Signature, values: dict[str, Any]) -> None:
    """The trainer's first `record` line: the automatic lines written before it go, and what
    they saw (their losses and input ids, in order) goes into it, before its own."""
    dropped = signature.steps[-signature.automatic :]
    del signature.steps[-signature.automatic :]
    signature.automatic = 0
    prefix = audit_key(AUTO, "")
    for key in {k for _, v in dropped for k in v if k.startswith(prefix)}:
        seen = [x for _, v in dropped if isinstance(v.get(key), list) for x in v[key]]
        own = values.get(key, [])
        if seen and isinstance(own, list):
            values[key] = seen + own


def _object(path: str, lineno: int, obj: dict, key: str, default: Any = None) -> dict:
    value = obj.get(key, default)
    if not isinstance(value, dict):
        raise SignatureError(f"{path}: line {lineno}: {key!r} is not a JSON object")
    return value


def _parse(path: str, lineno: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SignatureError(f"{path}: line {lineno} is not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise SignatureError(f"{path}: line {lineno} is not a JSON object")
    return obj


def read_run(run_dir: str, world_size: Optional[int] = None) -> dict[int, Signature]:
    """Every rank's signature of one launch, keyed by global rank."""
    sig_dir = os.path.dirname(signature_path(run_dir, 0))
    if world_size is None:
        if not os.path.isdir(sig_dir):
            raise SignatureError(f"{run_dir}: no signatures/ directory (not a run directory?)")
        names = [n for n in os.listdir(sig_dir) if n.startswith("rank-") and n.endswith(".jsonl")]
        if not names:
            raise SignatureError(f"{sig_dir}: no rank-*.jsonl signature files")
        ranks = sorted(int(n[5:-6]) for n in names if n[5:-6].isdigit())
    else:
        ranks = list(range(world_size))
    return {rank: read_signature(signature_path(run_dir, rank)) for rank in ranks}


class StepWatcher:
    """Follows the signature files of a launch that is still running, reading only what was
    appended since the last look, to tell when every rank has recorded a given step."""

    def __init__(self, run_dir: str, world_size: int) -> None:
        self.paths = [signature_path(run_dir, rank) for rank in range(world_size)]
        self.offsets = [0] * world_size
        self.partial = [b""] * world_size
        self.last: list[Optional[int]] = [None] * world_size

    def refresh(self) -> None:
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[rank])
                    data = f.read()
            except OSError:
                continue
            self.offsets[rank] += len(data)
            *lines, self.partial[rank] = (self.partial[rank] + data).split(b"\n")
            for line in lines:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                step = obj.get(STEP) if isinstance(obj, dict) else None
                if isinstance(step, int) and not isinstance(step, bool):
                    last = self.last[rank]
                    self.last[rank] = step if last is None else max(last, step)

    def recorded_through(self, step: int) -> bool:
        self.refresh()
        return all(last is not None and last >= step for last in self.last)

    @property
    def lowest(self) -> int:
        """The last step every rank has recorded (0 before the first)."""
        return min((last or 0) for last in self.last) if self.last else 0


MAX_VALUE_CHARS = 160


def readable(value: Any) -> str:
    """A short human form of an encoded value."""
    text = _readable(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _readable(value: Any) -> str:
    if isinstance(value, dict):
        if FLOAT_TAG in value:
            return repr(decode_float(value))
        if TENSOR_TAG in value:
            return _readable_tensor(value[TENSOR_TAG])
        return "{" + ", ".join(f"{k!r}: {_readable(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_readable(v) for v in value) + "]"
    return json.dumps(value)


def _readable_tensor(t: dict) -> str:
    shape = "x".join(map(str, t.get("shape", []))) or "scalar"
    parts = [f"{t.get('dtype')}[{shape}]"]
    if "values" in t and len(t["values"]) <= 4:
        parts.append("values=" + ", ".join(_number(v) for v in t["values"]))
    else:
        parts += [f"{k}={_number(v)}" for k, v in t.get("stats", {}).items()]
    parts.append(f"hash={str(t.get('hash'))[:12]}")
    return "tensor(" + " ".join(parts) + ")"


def _number(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def scalar(value: Any) -> Optional[float]:
    """The number an encoded value stands for, if it is one (exact floats come back exactly)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return decode_float(value)


def count(n: int, noun: str) -> str:
    """ "1 rank", "2 ranks"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
