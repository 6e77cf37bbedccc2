"""Where a hung rank was stuck: read its Python stack from a faulthandler dump or py-spy.

At a timeout every rank dumps its stack (faulthandler on SIGUSR1, registered by the rank's
bootstrap) into its stderr log, and, when py-spy is installed, `py-spy dump` adds one taken
from outside the process (it also sees a rank stuck in C code that never runs the handler).
The report then says, per rank, the innermost frame and the innermost frame of the user's own
code, instead of asking the reader to dig through logs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

PY_SPY_TIMEOUT = 10.0

_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^():]+):(?P<line>\d+)\)")
_NOT_USER = (
    os.sep + "pytest_resume_equiv" + os.sep,
    os.sep + "torch" + os.sep,
    "<frozen ",
    os.sep + "runpy.py",
    os.sep + "threading.py",
)
"""Frames that are not the user's code: the plugin's rank machinery, torch, the runner."""


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        parts = self.file.split(os.sep)
        return f"{os.sep.join(parts[-2:])}:{self.line} in {self.func}"


def faulthandler_frames(text: str) -> list[Frame]:
    """The main thread's frames (innermost first) from the last faulthandler dump in `text`."""
    blocks = re.split(r"^(?=(?:Current thread|Thread) 0x[0-9a-f]+ )", text, flags=re.M)
    dumps = [b for b in blocks if b.startswith(("Current thread", "Thread"))]
    if not dumps:
        return []
    current = [b for b in dumps if b.startswith("Current thread")]
    block = (current or dumps)[-1]
    return _frames(block, _FAULTHANDLER_FRAME)


def py_spy_frames(text: str) -> list[Frame]:
    """The main thread's frames (innermost first) from `py-spy dump` output."""
    blocks = re.split(r"^(?=Thread \S+ )", text, flags=re.M)
    threads = [b for b in blocks if b.startswith("Thread ")]
    main = [b for b in threads if '"MainThread"' in b.splitlines()[0]]
    block = (main or threads or [""])[0]
    return _frames(block, _PY_SPY_FRAME)


def _frames(block: str, pattern: re.Pattern) -> list[Frame]:
    frames = []
    for line in block.splitlines():
        match = pattern.match(line)
        if match:
            frames.append(Frame(match["file"], int(match["line"]), match["func"]))
    return frames


def summary(frames: list[Frame]) -> str:
    """`innermost frame` and, when different, `<- the user's innermost frame`."""
    if not frames:
        return ""
    # py-spy shortens paths to be relative to sys.path ("torch/distributed/..."): a leading
    # separator lets one set of marks match both its paths and faulthandler's absolute ones
    user = next((f for f in frames if not any(mark in os.sep + f.file for mark in _NOT_USER)), None)
    text = f"stuck in {frames[0]}"
    if user is not None and user != frames[0]:
        text += f", called from {user}"
    return text


def py_spy_dump(pid: int, out_path: str) -> Optional[str]:
    """Run `py-spy dump` on a live rank if py-spy is installed; its output, saved beside the
    rank's logs, or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")  # in the same venv
    exe = shutil.which("py-spy") or (beside if os.path.exists(beside) else None)
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = proc.stdout + proc.stderr
    try:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass
    return text if proc.returncode == 0 else None
