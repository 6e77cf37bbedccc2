"""How each rank of a finished launch ended, in words a report can use: from the status file
the rank wrote (rank/run_dir.py), torchrun's exit codes, and, for a hung rank, its stack."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Optional

from ..rank.run_dir import log_path, read_status, signature_path
from ..signature import SignatureError, read_signature
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


def _without_status(run_dir: str, rank: int, code: Optional[int], timed_out: bool) -> RankOutcome:
    """A rank that wrote no status file: hung, killed, or aborted after its last step."""
    if timed_out:
        detail = "still running at the timeout (killed)"
        where = stuck_where(run_dir, rank)
        return RankOutcome(rank, "none", f"{detail}; {where}" if where else detail, code)
    if code == -signal.SIGABRT:
        aborted = aborted_after_its_work(run_dir, rank)
        if aborted:
            return RankOutcome(rank, "shutdown", aborted, code)
    if code is not None and code < 0:
        return RankOutcome(rank, "none", f"killed by {_signal_name(code)}", code)
    if code is not None:
        return RankOutcome(
            rank, "none", f"exited with code {code} before the trainer finished", code
        )
    return RankOutcome(rank, "none", "ended without reporting a status (killed, or never started)")


ABORT_MARKS = ("terminate called without an active exception", "Fatal Python error: Aborted")
"""What a rank's stderr holds when C++ aborted it (std::terminate, then faulthandler)."""


def aborted_after_its_work(run_dir: str, rank: int) -> str:
    """A rank killed by SIGABRT after it recorded the launch's last step (its signature's
    header says which), in the trainer's own teardown (`destroy_process_group`, a thread of
    gloo or NCCL joined at exit): what happened, in words; "" for any other abort."""
    try:
        with open(log_path(run_dir, rank, "stderr"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    said = next((m for m in ABORT_MARKS if m in text), None)
    if said is None:
        return ""
    try:
        signature = read_signature(signature_path(run_dir, rank))
    except SignatureError:
        return ""
    steps, last = signature.header.get("steps"), max((s for s, _ in signature.steps), default=None)
    if not isinstance(steps, int) or not steps or last is None or last < steps:
        return ""
    frames = faulthandler_frames(text)
    where = f" in {frames[0]}" if frames else ""
    return (
        f"recorded its last step ({last}), then aborted{where} (SIGABRT: {said!r}): a C++ "
        "thread torn down at exit, after the work was done and recorded, is not a failed launch"
    )


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
            outcomes.append(_without_status(run_dir, rank, code, timed_out))
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
            outcome.detail = f"{STOPPED} after rank {failed[0]} failed"
    return outcomes


STOPPED = "stopped by torchrun (SIGTERM)"


def failed_first(ranks: list[RankOutcome]) -> list[RankOutcome]:
    """The ranks that failed: those that failed on their own first, then those stopped
    because of them (which of two ranks fails first on a torn checkpoint is a race)."""
    return sorted((r for r in ranks if not r.ok), key=lambda r: r.detail.startswith(STOPPED))
