"""Shared bits of the benchmark scripts: timing subprocesses and printing ratio tables.

Every benchmark measures its baseline in the same run, on the same machine, and prints
ratios; nothing here asserts a time.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BYTECODE_WAS_OFF = os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None
"""Users run an installed wheel, whose modules pip compiled to bytecode at install: every
process a benchmark starts may write and read `.pyc` files too. With PYTHONDONTWRITEBYTECODE
set (some sandboxes set it), each pytest process would compile the plugin's ~140 modules
again (about 0.3 s on the 2-core machine), a cost no user pays."""


def machine() -> str:
    import torch

    return (
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.platform()}"
        + (
            " (PYTHONDONTWRITEBYTECODE dropped: bytecode cached, as installed)"
            if BYTECODE_WAS_OFF
            else ""
        )
    )


def timed_run(argv: Sequence[str], cwd: str, expect: int = 0) -> float:
    """Wall seconds of one subprocess; a wrong exit status stops the benchmark (its numbers
    would mean nothing)."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != expect:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{argv!r} exited {proc.returncode}, expected {expect}")
    return elapsed


def children_cpu() -> float:
    """CPU seconds (user + system) of every finished child so far, theirs included: under
    load a process's wall time stretches, its CPU time much less."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median_of(samples: list[float]) -> float:
    return statistics.median(samples)


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
