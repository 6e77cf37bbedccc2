"""This rank's signature file: one exact JSON line per recorded step, flushed as written.

Beside the steps the file holds the restore log (a line per restore call, in the order they
happened), the resume-point snapshots, the audit keys left out on purpose, and a footer. The
lines are laid out as rank/layout.py declares them; signature.py reads them back.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
from typing import IO, Any, Callable, Optional

from .layout import (
    AUTOMATIC,
    COUNTERS,
    END,
    FILE_EVENT,
    IGNORED,
    LOADED,
    PREFLIGHT,
    RESTORE,
    RESUME_POINT,
    SIGNATURE_FORMAT,
    SIGNATURE_VERSION,
    STEP,
    VALUES,
)

Drain = Callable[[], list[dict[str, Any]]]
"""The restore-log entries logged since the last line (they are written before it)."""


def header(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    phase: str,
    split: Optional[int],
    splits: list[int],
    steps: int,
    device: str,
) -> dict[str, Any]:
    """Line 1: who wrote the file, in which launch, with which versions."""
    node = os.environ.get("SLURMD_NODENAME")  # a Slurm launch: the node's name
    torch = sys.modules.get("torch")
    return {
        **({"node": node} if node else {}),
        "format": SIGNATURE_FORMAT,
        "version": SIGNATURE_VERSION,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "phase": phase,
        "split": split,
        "splits": splits,
        "steps": steps,
        "torch": getattr(torch, "__version__", None),
        "python": platform.python_version(),
        "device": device,
        "pid": os.getpid(),
    }


class SignatureWriter:
    """One open signature file; every line is flushed so a crashed rank leaves a prefix."""

    def __init__(self, path: str, first_line: dict[str, Any], drain: Drain) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.records = 0
        self.drain = drain
        self._lock = threading.Lock()  # a background save's file events come from its thread
        self.file: Optional[IO[str]] = open(path, "w", encoding="utf-8")
        self._write(first_line)

    @property
    def is_open(self) -> bool:
        return self.file is not None

    def _write(self, obj: dict[str, Any]) -> None:
        """One line, after the restores logged since the last one (none before the header)."""
        with self._lock:
            assert self.file is not None
            restores = self.drain() if self.file.tell() else []
            lines = [{RESTORE: entry} for entry in restores] + [obj]
            text = (json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
            self.file.write("".join(text))
            self.file.flush()

    def file_event(self, event: dict[str, Any]) -> None:
        if self.file is not None:
            self._write({FILE_EVENT: event})

    def write_step(
        self,
        step: int,
        values: dict[str, Any],
        sections: dict[str, Any],
        counters: Optional[dict[str, int]] = None,
        automatic: bool = False,
    ) -> None:
        """The user's encoded `values` and the captured `sections` (an empty one is left out),
        and the step `counters` of the optimizers and schedulers found (not compared: they
        tell which step a resumed run's checkpoint is of). `automatic`: written by automatic
        recording, with no `record` call (layout.AUTOMATIC)."""
        if self.file is None:
            raise RuntimeError("record() called after the signature file was closed")
        line = {STEP: step, VALUES: values, **{k: v for k, v in sections.items() if v}}
        if counters:
            line[COUNTERS] = counters
        if automatic:
            line[AUTOMATIC] = True
        self._write(line)
        self.records += 1

    def preflight(self, knobs: dict[str, Any]) -> None:
        if self.file is not None:
            self._write({PREFLIGHT: knobs})

    def loaded(self, found: dict[str, Any]) -> None:
        if self.file is not None:
            self._write({LOADED: found})

    def resume_point(self, snapshot: dict[str, Any]) -> None:
        if self.file is not None:
            self._write({RESUME_POINT: snapshot})

    def close(self, ignored: list[str], found: Optional[list[str]] = None) -> None:
        """Write the footer: it tells the plugin this rank finished recording cleanly, and
        which watched objects automatic recording found (`found`: not given to `watch`)."""
        if self.file is None:
            return
        if ignored:
            self._write({IGNORED: ignored})
        footer: dict[str, Any] = {"records": self.records}
        if found:
            footer["found"] = found
        self._write({END: footer})
        self.file.close()
        self.file = None
