"""Where a launch's time goes, phase by phase, when a benchmark asks (`RESUME_EQUIV_TIMINGS`
names a file): the host and every rank append one line per mark, `<wall time> <pid> <launch>
<phase>`, with `O_APPEND` (a line is one write: lines of concurrent processes never mix).
benchmarks/bench_phases.py reads them back into the phase table of docs/performance.md.

Unset (always, outside a benchmark) a mark is one lookup in `os.environ` and nothing else,
and no patch is installed. Host and rank alike import this module: it imports nothing of
the plugin's host side."""

from __future__ import annotations

import os
import sys
import time
import zlib
from typing import Any, Optional

from .patches import Patches

ENV = "RESUME_EQUIV_TIMINGS"

RANK_PHASES = (
    "rank.start",
    "rank.installed",
    "rank.user",
    "pg.start",
    "pg.done",
    "rank.first_step",
    "rank.user_done",
    "rank.closed",
    "rank.exit",
)
"""What a rank marks, in order: the fork (or exec) reached the bootstrap; the plugin's
recording is installed and the signature opened; the user's code starts; its
`init_process_group` starts and returns; the first optimizer step starts; the user's code
returned; the signature is closed; the process leaves."""
HOST_PHASES = ("host.started", "host.exited", "host.judging", "host.judged")
"""What the host marks per launch: its ranks (or agents) started; the host saw every one
exit; it reads and compares the signatures; done."""


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def mark(phase: str, launch: str) -> None:
    """One line for `phase` of `launch` (its run directory's name), if asked for."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = f"{time.time():.6f} {os.getpid()} {launch_name(launch)} {phase}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def launch_name(launch: str) -> str:
    """The launch's run directory's name, and a short hash of where it is: every test has
    its own `resumed-split3`, and their marks must not be taken for one launch's."""
    name = os.path.basename(launch) or "-"
    where = os.path.dirname(launch)
    if not where:
        return name
    return f"{name}@{zlib.crc32(where.encode()):08x}"


class ProcessGroupTimer:
    """`torch.distributed.init_process_group` marked before and after (the rendezvous and
    the process group's setup), in a rank whose torch is imported already (a forked rank),
    only when timings are asked for."""

    def __init__(self, launch: str) -> None:
        self.launch = launch
        self.patches = Patches(__name__)

    def install(self) -> None:
        dist: Optional[Any] = sys.modules.get("torch.distributed")
        if not enabled() or dist is None or not hasattr(dist, "init_process_group"):
            return
        original = dist.init_process_group
        launch = self.launch

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            mark("pg.start", launch)
            try:
                return original(*args, **kwargs)
            finally:
                mark("pg.done", launch)

        self.patches.replace(dist, "init_process_group", init_process_group)

    def uninstall(self) -> None:
        self.patches.restore()
