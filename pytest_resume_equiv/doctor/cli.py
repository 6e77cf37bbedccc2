"""`python -m pytest_resume_equiv doctor`: the checks in order, the table, the JSON, the exit
status (0: resume tests can run here, 1: something blocks them, 2: bad arguments).

`examine` takes its seams (how modules import, the environment, where device locks live,
what the probe and trainer launches run, whether the resume test runs) so that every branch
and every failing row is tested on CPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..launch.devices import HostProbe, Importer
from ..settings import DEVICES
from . import determinism, environment, launches, leftovers, resume
from .rows import FAIL, OK, Row, blocked, table, to_json

CAN_RUN, BLOCKED = 0, 1
DEFAULT_TIMEOUT = 120.0
"""Seconds one doctor launch may take (a launch of a test gets --resume-equiv-timeout)."""
LEFTOVER_GRACE = 5.0
"""Seconds processes killed at the end get to disappear before they count as left running."""


@dataclass
class Seams:
    """What `examine` talks to; the defaults are this machine."""

    import_module: Importer = importlib.import_module
    host_probe: Optional[HostProbe] = None
    """How devices are counted (None: as the plugin counts them)."""
    device_query: Callable[[str], environment.DeviceFacts] = environment.facts_in_child
    environ: Optional[Mapping[str, str]] = None
    lock_dir: Optional[str] = None
    probe: launches.Target = launches.PROBE
    trainer: launches.Target = launches.TRAINER
    resume_test: Callable[[str, int, float, str], list[Row]] = resume.run
    facts: dict[str, Any] = field(default_factory=dict)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    """The `doctor` subcommand on the CLI's subparsers."""
    doctor = sub.add_parser(
        "doctor",
        help="can this machine run resume tests, and will their verdicts be exact?",
        description="Check this machine for resume tests: environment, backends, a real "
        "resume test of a tiny trainer, determinism, teardown. Exit 0: resume tests can run "
        "here; 1: something blocks them; 2: bad arguments.",
    )
    doctor.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="the device to check, as --resume-equiv-device (default auto: cuda, npu, xpu)",
    )
    doctor.add_argument(
        "--nproc", type=_positive_int, default=2, help="ranks per launch (default 2)"
    )
    doctor.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    doctor.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds each launch may take before it counts as hung (default {DEFAULT_TIMEOUT:g})",
    )


def examine(
    device: str, nproc: int, timeout: float, workdir: str, seams: Optional[Seams] = None
) -> tuple[list[Row], dict[str, Any]]:
    """Every check, in order; the rows and the facts for the JSON."""
    seams = seams or Seams()
    marker = leftovers.mark()
    started = time.monotonic()
    rows = environment.versions(seams.import_module)
    facts: dict[str, Any] = {"requested": device, "nproc": nproc, "timeout": timeout}
    if rows[0].status == FAIL:
        return rows, facts
    picked = environment.pick(device, nproc, seams.host_probe, seams.import_module)
    chosen = picked.device
    facts.update(device=chosen.kind, backend=chosen.backend, devices=chosen.count)
    rows += picked.rows
    rows += environment.devices(chosen, seams.device_query)
    rows += environment.leases(chosen, nproc, seams.environ, seams.lock_dir)
    runner = launches.Launches(
        os.path.join(workdir, "launches"), chosen, nproc, timeout, seams.lock_dir
    )
    backends = environment.backends_to_try(chosen, seams.import_module)
    backend_rows = launches.backend_rows(runner, backends, seams.probe)
    rows += backend_rows
    if backend_rows[0].status == FAIL:
        why = f"not run: the {backends[0]} backend does not come up (see above)"
        rows += [
            Row("resume test", "verdict", FAIL, why, "fix the backend first"),
            Row("determinism", "two runs", FAIL, why, "fix the backend first"),
        ]
    else:
        rows += seams.resume_test(chosen.kind, nproc, timeout, os.path.join(workdir, "resume"))
        rows += determinism.rows(launches.repeat(runner, seams.trainer), chosen.kind)
    rows += launches.teardown_rows(runner)
    rows.append(launches.fork_server_row(runner))
    stopped = launches.stop_fork_server()
    if stopped is not None:
        rows.append(stopped)
    rows.append(leftover_row(marker))
    facts["seconds"] = round(time.monotonic() - started, 1)
    return rows, facts


def leftover_row(marker: str) -> Row:
    deadline = time.monotonic() + LEFTOVER_GRACE
    while True:
        found = leftovers.marked_processes(marker)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if found is None:
        return Row(
            "teardown", "left running", OK, "cannot list processes here (no /proc): not checked"
        )
    if found:
        shown = "; ".join(f"pid {pid}: {leftovers.cmdline(pid)}" for pid in found[:4])
        return Row(
            "teardown",
            "left running",
            FAIL,
            f"{len(found)} process(es) the doctor started still run: {shown}",
            "a rank or server that outlives its launch holds devices and ports: kill them by "
            "pid, and report it with the JSON",
        )
    return Row("teardown", "left running", OK, "nothing the doctor started is still running")


def main(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="resume-equiv-doctor-")
    os.chmod(workdir, 0o700)
    rows, facts = examine(args.device, args.nproc, args.timeout, workdir)
    stuck = blocked(rows)
    if stuck:
        facts["kept"] = workdir
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(table(rows))
    if stuck:
        print(f"kept for a look: {workdir}")
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(to_json(rows, facts), f, indent=2)
        except OSError as exc:
            print(f"error: cannot write --json {args.json}: {exc}")
            return BLOCKED
    return BLOCKED if stuck else CAN_RUN


__all__ = ["BLOCKED", "CAN_RUN", "OK", "add_parser", "examine", "main"]
