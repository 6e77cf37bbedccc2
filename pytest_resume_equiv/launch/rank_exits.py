"""How each rank of a finished launch ended, in words a report can use: from the status file
the rank wrote (rank/run_dir.py), torchrun's exit codes, and, for a hung rank, its stack."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Optional

from ..rank.run_dir import log_path, read_status
from .stacks import faulthandler_frames, py_spy_frames, summary


@dataclass
class RankOutcome:
    rank: int
    status: str
    """ok | error | exit | shutdown (finished, then died on the way out) | none (no status
    file: killed by a signal, or hung)"""
    detail: str = ""
    exitcode: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_EXIT_RE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _agent_exitcodes(log_text: str) -> dict[int, int]:
    """Per-rank exit codes from torchrun's failure summary (best effort)."""
    codes: dict[int, int] = {}
    for block in log_text.split("[")[1:]:
        match = _EXIT_RE.search(block)
        if match:
            codes[int(match.group(1))] = int(match.group(2))
    return codes


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def stuck_where(run_dir: str, rank: int) -> str:
    """Where a rank killed at the timeout was stuck (py-spy's view first, then faulthandler's)."""
    for stream, parse in (("pyspy", py_spy_frames), ("stderr", faulthandler_frames)):
        try:
            with open(log_path(run_dir, rank, stream), encoding="utf-8", errors="replace") as f:
                where = summary(parse(f.read()))
        except OSError:
            continue
        if where:
            return where
    return ""


def rank_outcomes(
    run_dir: str,
    world_size: int,
    agent_text: str,
    timed_out: bool,
    exitcodes: Optional[dict[int, int]] = None,
) -> list[RankOutcome]:
    """Per rank: ok, error, exit, shutdown (died after its work) or none (no status).
    `exitcodes`: the ranks' own exit codes where they were started without an agent."""
    codes = {**_agent_exitcodes(agent_text), **(exitcodes or {})}
    outcomes = []
    for rank in range(world_size):
        status = read_status(run_dir, rank)
        code = codes.get(rank)
        if status is None:
            if timed_out:
                detail = "still running at the timeout (killed)"
                where = stuck_where(run_dir, rank)
                if where:
                    detail += f"; {where}"
            elif code is not None and code < 0:
                detail = f"killed by {_signal_name(code)}"
            elif code is not None:
                detail = f"exited with code {code} before the trainer finished"
            else:
                detail = "ended without reporting a status (killed, or never started)"
            outcomes.append(RankOutcome(rank, "none", detail, code))
        elif status.status == "ok" and code is not None and code != 0:
            # Work done and signature closed, then the interpreter died on the way out
            # (e.g. SIGABRT from a communication thread torn down at exit).
            how = f"killed by {_signal_name(code)}" if code < 0 else f"exit code {code}"
            detail = (
                f"finished its work and closed its signature, then died during interpreter "
                f"shutdown ({how})"
            )
            outcomes.append(RankOutcome(rank, "shutdown", detail, code))
        elif status.status == "ok":
            outcomes.append(RankOutcome(rank, "ok", "", 0))
        elif status.status == "exit":
            outcomes.append(
                RankOutcome(rank, "exit", f"exited with code {status.code}", status.code)
            )
        else:
            outcomes.append(RankOutcome(rank, "error", status.message or "raised", 1))
    failed = [
        o.rank
        for o in outcomes
        if o.status in ("error", "exit")
        or (o.status == "none" and o.exitcode is not None and o.exitcode != -signal.SIGTERM)
    ]
    for outcome in outcomes:
        if failed and outcome.status == "none" and outcome.exitcode == -signal.SIGTERM:
            outcome.detail = f"stopped by torchrun (SIGTERM) after rank {failed[0]} failed"
    return outcomes
