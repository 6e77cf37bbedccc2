"""`record(step, **values)`: append one exact line per step to this rank's signature file.

Beside the steps the file holds the restore log (a line per restore call, in the order they
happened), the resume-point snapshot, and the audit names left out on purpose.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
from typing import IO, Any, Optional

from . import restore, resume_point, rng, watch
from .context import RunContext, context
from .encode import encode
from .layout import SIGNATURE_FORMAT, SIGNATURE_VERSION, signature_path


class _SignatureWriter:
    """One open signature file; every line is flushed so a crashed rank leaves a prefix."""

    def __init__(self, ctx: RunContext) -> None:
        path = signature_path(ctx.run_dir, ctx.rank)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.records = 0
        self.last_step: Optional[int] = None
        self.file: Optional[IO[str]] = open(path, "w", encoding="utf-8")
        node = os.environ.get("SLURMD_NODENAME")  # a Slurm launch: the node's name
        self._write(
            {
                **({"node": node} if node else {}),
                "format": SIGNATURE_FORMAT,
                "version": SIGNATURE_VERSION,
                "rank": ctx.rank,
                "local_rank": ctx.local_rank,
                "world_size": ctx.world_size,
                "phase": ctx.phase,
                "split": ctx.split if ctx.resuming else None,
                "splits": list(ctx.splits),
                "steps": ctx.steps,
                "torch": _torch_version(),
                "python": platform.python_version(),
                "device": ctx.device_kind,
                "pid": os.getpid(),
            }
        )
        atexit.register(self.close)

    def _write(self, obj: dict[str, Any]) -> None:
        """One line, after the restores logged since the last one (none before the header)."""
        assert self.file is not None
        restores = restore.drain() if self.file.tell() else []
        lines = [{"restore": entry} for entry in restores] + [obj]
        self.file.write(
            "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
        )
        self.file.flush()

    def write_step(self, step: int, values: dict[str, Any]) -> None:
        if self.file is None:
            raise RuntimeError("record() called after the signature file was closed")
        line: dict[str, Any] = {"step": step, "values": values, "rng": rng.audit()}
        watched = watch.audit()
        if watched:
            line["watch"] = watched
        self._write(line)
        self.records += 1
        self.last_step = step

    def resume_point(self, snapshot: dict[str, Any]) -> None:
        if self.file is not None:
            self._write({"resume_point": snapshot})

    def close(self) -> None:
        """Write the footer: it tells the plugin this rank finished recording cleanly."""
        if self.file is None:
            return
        ignored = rng.ignored()
        if ignored:
            self._write({"ignored": ignored})
        self._write({"end": {"records": self.records}})
        self.file.close()
        self.file = None


def _torch_version() -> Optional[str]:
    import sys

    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None)


_writer: Optional[_SignatureWriter] = None


def record(step: int, **values: Any) -> None:
    """Record this rank's values at the end of `step` (a no-op outside a test run)."""
    ctx = context()
    if ctx is None:
        return
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"record(step=...) needs an int step number, got {step!r}")
    encoded = {
        key: encode(value, f"record(step={step}) value {key!r}") for key, value in values.items()
    }
    write = writer()
    write.write_step(step, encoded)
    resume_point.after_record(ctx, step, write)
    if ctx.phase == "teeth" and write.records == 1:
        # The teeth check: from here on every random stream is unrelated to the uninterrupted
        # run's, so a signature that still matches cannot depend on random state at all.
        rng.mutate()


def writer() -> _SignatureWriter:
    """This rank's open signature (opened on first use)."""
    global _writer
    if _writer is None:
        ctx = context()
        assert ctx is not None, "writer() outside a test run"
        _writer = _SignatureWriter(ctx)
    return _writer


def is_open() -> bool:
    return _writer is not None and _writer.file is not None


def last_step() -> Optional[int]:
    """The last step this rank recorded (None before the first): where a restore happened."""
    return _writer.last_step if _writer is not None else None


def close() -> None:
    if _writer is not None:
        _writer.close()


def open_signature() -> None:
    """Write the header now, so even a rank that never records leaves a file saying so."""
    global _writer
    ctx = context()
    if ctx is not None and _writer is None:
        _writer = _SignatureWriter(ctx)
