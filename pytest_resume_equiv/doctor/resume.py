"""A real resume test on the device: `resume_test.py` run by a pytest of its own, with the
plugin's whole path (plan, schedule, fork server, leases, judge, teeth check) and its JSON
report; then every audited stream at the resume point, restored or not, read from the kept
run directories.

The pytest is isolated from the user's configuration (its own ini and rootdir, no
PYTEST_ADDOPTS, no autoloaded plugins, none of the PYTEST_RESUME_EQUIV_* options but the
fork server's), so the verdict is about this machine, not about a conftest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any, Optional

from ..signature import Signature, SignatureError, read_run
from . import resume_test
from .rows import FAIL, OK, WARN, Row

KEPT_OPTIONS = ("PYTEST_RESUME_EQUIV_FORK_SERVER", "PYTEST_RESUME_EQUIV_PRELOAD")
"""The user's options that still apply: how ranks start on this machine."""
LAUNCHES = 4
"""Launches of the test, one after another at worst: what its pytest's timeout allows for."""


def _row(check: str, status: str, seen: str, fix: str = "") -> Row:
    return Row("resume test", check, status, seen, fix)


def command(
    kind: str, nproc: int, timeout: float, workdir: str
) -> tuple[list[str], dict[str, str]]:
    """The pytest command line and environment of the doctor's resume test."""
    ini = os.path.join(workdir, "pytest.ini")
    with open(ini, "w", encoding="utf-8") as f:
        f.write("[pytest]\n")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        ini,
        f"--rootdir={workdir}",
        "-p",
        "no:cacheprovider",
        "-p",
        "resume_equiv",
        f"--resume-equiv-device={kind}",
        "--resume-equiv-require-device",
        "--resume-equiv-keep=all",
        f"--resume-equiv-report={report_path(workdir)}",
        f"--resume-equiv-timeout={timeout:g}",
        f"--basetemp={os.path.join(workdir, 'tmp')}",
        "-q",
        "-p",
        "no:randomly",
        resume_test.__file__,
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("PYTEST_RESUME_EQUIV_") and k not in KEPT_OPTIONS)
        and k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
    }
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **{resume_test.NPROC_ENV: str(nproc)})
    return argv, env


def report_path(workdir: str) -> str:
    return os.path.join(workdir, "report.json")


def run(kind: str, nproc: int, timeout: float, workdir: str) -> list[Row]:
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    argv, env = command(kind, nproc, timeout, workdir)
    limit = timeout * LAUNCHES + 60
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # pytest kills every launch it started
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        return [
            _row(
                "verdict",
                FAIL,
                f"the resume test did not end within {limit:g}s: {_tail(output)}",
                "the teardown rows say whether a rank hangs; --timeout bounds each launch",
            )
        ]
    return rows_from_report(report_path(workdir), proc.returncode, output)


def _tail(output: str, lines: int = 6) -> str:
    kept = [line for line in (output or "").strip().splitlines() if line.strip()]
    return " / ".join(kept[-lines:])[-600:]


def rows_from_report(path: str, returncode: int, output: str) -> list[Row]:
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        test = report["tests"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return [
            _row(
                "verdict",
                FAIL,
                f"pytest ended with status {returncode} and no report: {_tail(output)}",
                "run the command in the doctor's JSON (resume_test_command) to see the whole output",
            )
        ]
    out = [_verdict_row(test, output)]
    run = test["runs"][0] if test.get("runs") else {}
    out.append(_teeth_row(run))
    out += stream_rows(run)
    return out


def _verdict_row(test: dict[str, Any], output: str) -> Row:
    run = test["runs"][0] if test.get("runs") else {}
    launches = ", ".join(
        f"{x['name']} {x['seconds']:.1f}s" + ("" if x["status"] == "ok" else f" ({x['status']})")
        for x in run.get("launches", [])
    )
    where = f"{test.get('ranks')} {test.get('device')} ranks, steps {test.get('steps')}, split {test.get('splits')}"
    verdict = test.get("verdict")
    if verdict == "passed":
        return _row("verdict", OK, f"passed: {where}; launches {launches}")
    failure = (run.get("failure") or _tail(output)).strip().splitlines()
    text = " / ".join(line.strip() for line in failure[:6])
    status = WARN if verdict in ("abstained", "skipped") else FAIL
    fix = (
        "the determinism rows say why this box does not reproduce a run"
        if status == WARN
        else "the rows above say what blocks it; the run directories are kept under the doctor's directory"
    )
    return _row("verdict", status, f"{verdict}: {where}; {text}", fix)


def _teeth_row(run: dict[str, Any]) -> Row:
    teeth = run.get("teeth") or {}
    status = teeth.get("status")
    why = teeth.get("why", "")
    if status == "passed":
        return _row("teeth check", OK, why or "passed")
    if status in (None, "", "cancelled"):
        return _row("teeth check", FAIL, f"did not run ({why or 'the resume did not pass'})", "")
    return _row(
        "teeth check",
        FAIL,
        f"{status}: {why}",
        "the comparison cannot see the random streams on this machine: report it with the JSON",
    )


def stream_rows(run: dict[str, Any]) -> list[Row]:
    """Every audited stream (and watched object) at the resume point, on every rank:
    restored when the resumed run holds exactly what the uninterrupted run held there."""
    verdict = next((v for v in run.get("verdicts", []) if v.get("check") == "resume"), None)
    if verdict is None:
        return [_row("streams", FAIL, "no resume was judged, so no stream was compared", "")]
    dirs = verdict.get("runs", {})
    split = int(verdict.get("split", 0))
    try:
        base = read_run(dirs["uninterrupted"])
        resumed = read_run(dirs["resumed"])
    except (KeyError, SignatureError) as exc:
        return [_row("streams", FAIL, f"the kept run directories cannot be read: {exc}", "")]
    states = _states(base, resumed, split)
    if not states:
        return [_row("streams", FAIL, "no resume point was recorded", "")]
    out = []
    for name, per_rank in sorted(states.items()):
        lost = [rank for rank, (held, how) in sorted(per_rank.items()) if not held]
        how = next((h for _, h in per_rank.values() if h), "")
        restored_by = (
            f", restored by {how}" if how else " (no call restored it: it moved alike in both runs)"
        )
        if lost:
            out.append(
                _row(
                    f"stream {name}",
                    FAIL,
                    f"not restored on rank(s) {', '.join(map(str, lost))}",
                    "the tiny trainer restores it: the audit or the load misbehaves here",
                )
            )
        else:
            out.append(
                _row(f"stream {name}", OK, f"held on all {len(per_rank)} ranks{restored_by}")
            )
    return out


def _states(
    base: dict[int, Signature], resumed: dict[int, Signature], split: int
) -> dict[str, dict[int, tuple[bool, str]]]:
    """stream or watched object -> rank -> (held exactly at the resume point, the call that
    restored it)."""
    states: dict[str, dict[int, tuple[bool, str]]] = {}
    for rank, sig in sorted(resumed.items()):
        ours: Optional[dict[str, Any]] = sig.resume_points[0] if sig.resume_points else None
        theirs = base[rank].resume_point(split) if rank in base else None
        if ours is None or theirs is None:
            continue
        calls = {}
        for entry in sig.restores:
            calls[str(entry.get("what", ""))] = str(entry.get("call", ""))
        for section in ("rng", "watch"):
            mine, other = ours.get(section) or {}, theirs.get(section) or {}
            for name in sorted(set(mine) | set(other)):
                key = f"{section}:{name}"
                held = name in mine and name in other and mine[name] == other[name]
                states.setdefault(key, {})[rank] = (held, calls.get(key, ""))
    return states
