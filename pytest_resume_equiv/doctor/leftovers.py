"""Nothing the doctor started may outlive it: every process it starts (launches, fork
servers, the resume test's pytest and all their children) inherits one marker variable, and
afterwards no process but the doctor may carry it."""

from __future__ import annotations

import os
import secrets
from typing import Optional

MARK_ENV = "RESUME_EQUIV_DOCTOR_MARK"


def mark() -> str:
    """Mark this process's environment (so every child inherits it); the marker's value."""
    value = os.environ.get(MARK_ENV) or secrets.token_hex(8)
    os.environ[MARK_ENV] = value
    return value


def marked_processes(value: str, proc: str = "/proc") -> Optional[list[int]]:
    """Pids of the processes (other than this one) whose environment carries the marker;
    None where processes cannot be listed (no /proc)."""
    if not os.path.isdir(proc):
        return None
    needle = f"{MARK_ENV}={value}".encode()
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(os.path.join(proc, entry, "environ"), "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or another user's
            continue
    return sorted(found)


def cmdline(pid: int, proc: str = "/proc") -> str:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"
