"""The run directory: every file a launch's ranks and the plugin write into it, and the
schemas of the small ones (pid files, status files, the stacks request).

Both sides import it, so the writer (a rank) and the reader (the plugin) cannot drift apart.
What a signature file holds line by line is `layout.py`'s; how a rank learns its run directory
(the run context's variable) is `launch_context.py`'s. A run directory looks like this::

    <run_dir>/
      signatures/rank-<R>.jsonl   written by each rank (see signature.py for the format)
      logs/rank-<R>.stdout|stderr|pyspy, logs/agent-<N>.log
      pids/rank-<R>.pid           the rank's pid and host, so the plugin can kill ranks
                                  torchrun put in sessions of their own
      status/rank-<R>.json        how the user's code ended (RankStatus)
      status/crashed.json         interrupt="crash": where the ranks were killed
      status/preempted.json       crash_mode="preempt": how the grace ended (rank/grace.py)
      status/replaced/            a power-loss crash launch: hard links to the files its
                                  renames replaced (checks/power_loss.py brings them back)
      gate-open                   created by the plugin: a prestarted launch may run now
      launch.json, KEEP           the plugin's own notes on a shared uninterrupted launch
      dump-stacks                 created by the plugin: a timed-out launch's ranks dump stacks
      launch-token, rendezvous.json  a Slurm launch: the proof every node sees the run
                                  directory, and node 0's rendezvous endpoint
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

RANK_DIRS = ("signatures", "logs", "pids", "status")
"""The folders every launch writes into its run directory."""
GATE_FILE = "gate-open"
RESULT_FILE = "launch.json"
"""A shared uninterrupted launch's result, for the tests that reuse it."""
KEEP_FILE = "KEEP"
"""Written into a shared uninterrupted launch a failed test used: keep it at session end."""
STACKS_FILE = "dump-stacks"
STACKS_REQUEST = "dump"
TOKEN_FILE = "launch-token"
RENDEZVOUS_FILE = "rendezvous.json"
STORE_PORT_FILE = "store-port"
SLURM_PROBLEM = "resume-equiv slurm:"
"""How `rank/slurm_agent.py` starts a line the plugin quotes as the launch's problem."""
PLUGIN_FILES = (
    GATE_FILE,
    RESULT_FILE,
    KEEP_FILE,
    STACKS_FILE,
    TOKEN_FILE,
    RENDEZVOUS_FILE,
    STORE_PORT_FILE,
)
"""Files the plugin itself writes at the top of a run directory."""


def user_files(run_dir: str) -> list[tuple[str, Optional[int]]]:
    """What the training wrote into a run directory (not the plugin's own folders and
    files): (path relative to it, size in bytes, or None for a folder), sorted."""
    found: list[tuple[str, Optional[int]]] = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        if dirpath == run_dir:
            dirnames[:] = [d for d in dirnames if d not in RANK_DIRS]
            filenames = [f for f in filenames if f not in PLUGIN_FILES]
        for name in dirnames:
            found.append((os.path.relpath(os.path.join(dirpath, name), run_dir), None))
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                size: Optional[int] = os.path.getsize(path)
            except OSError:
                continue  # gone meanwhile
            found.append((os.path.relpath(path, run_dir), size))
    return sorted(found)


def signature_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "signatures", f"rank-{rank}.jsonl")


def log_path(run_dir: str, rank: int, stream: str) -> str:
    return os.path.join(run_dir, "logs", f"rank-{rank}.{stream}")


def agent_log_path(run_dir: str, node: int) -> str:
    """torchrun's own output (one agent per simulated node)."""
    return os.path.join(run_dir, "logs", f"agent-{node}.log")


def status_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "status", f"rank-{rank}.json")


def crash_record_path(run_dir: str) -> str:
    """interrupt="crash": where the rank that reached the crash point says which it was."""
    return os.path.join(run_dir, "status", "crashed.json")


def replaced_path(run_dir: str) -> str:
    """A power-loss crash launch: where a rank keeps the files its renames replace."""
    return os.path.join(run_dir, "status", "replaced")


def pid_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "pids", f"rank-{rank}.pid")


def store_port_path(run_dir: str) -> str:
    """Where rank 0 of a launch without an agent says the port of the store it holds."""
    return os.path.join(run_dir, STORE_PORT_FILE)


def gate_path(run_dir: str) -> str:
    """Created by the plugin when a prestarted launch may run the user's code."""
    return os.path.join(run_dir, GATE_FILE)


def write_pid(run_dir: str, rank: int, pid: int) -> None:
    """`pid host`: the plugin signals only the ranks on its own host."""
    path = pid_path(run_dir, rank)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{pid} {socket.gethostname()}")


def read_pids(run_dir: str) -> dict[int, int]:
    """rank -> pid of the ranks on this host, from the pid files the ranks wrote so far."""
    folder = os.path.dirname(pid_path(run_dir, 0))
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    here = socket.gethostname()
    pids: dict[int, int] = {}
    for name in names:
        stem = name[len("rank-") : -len(".pid")]
        if not (name.startswith("rank-") and name.endswith(".pid") and stem.isdigit()):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                pid, _, host = f.read().strip().partition(" ")
            if host in ("", here):
                pids[int(stem)] = int(pid)
        except (OSError, ValueError):
            continue
    return pids


def stacks_request_path(run_dir: str) -> str:
    """Created by the plugin when a launch timed out: every rank dumps its stacks once."""
    return os.path.join(run_dir, STACKS_FILE)


def request_stacks(run_dir: str) -> None:
    """Written into (not created): a Slurm launch creates the file empty at its start, and a
    node's NFS cache then sees the new content on its next open."""
    try:
        with open(stacks_request_path(run_dir), "w", encoding="utf-8") as f:
            f.write(STACKS_REQUEST)
    except OSError:
        pass


def stacks_requested(run_dir: str) -> bool:
    try:
        with open(stacks_request_path(run_dir), encoding="utf-8") as f:
            return f.read().strip() == STACKS_REQUEST
    except OSError:
        return False


def launch_token_path(run_dir: str) -> str:
    """A token the plugin writes before a Slurm launch; every node reads it back to prove it
    sees the same run directory."""
    return os.path.join(run_dir, TOKEN_FILE)


def rendezvous_path(run_dir: str) -> str:
    """Where node 0 of a Slurm launch writes the rendezvous endpoint for the others."""
    return os.path.join(run_dir, RENDEZVOUS_FILE)


@dataclass(frozen=True)
class RankStatus:
    """How the user's code ended in one rank, as the rank itself saw it."""

    status: str
    """"ok" (returned or exited 0), "exit" (SystemExit with a nonzero code), "error" (raised)."""
    code: int = 0
    message: str = ""
    """The SystemExit argument ("exit") or "ExceptionType: text" ("error")."""
    traceback: str = ""
    call: Optional[dict[str, Any]] = None
    """"error": the watched file or load call the exception came out of (`op`, `path`, `to`,
    `mode`, `after_step`, `error`; `rank/wrapping.py`), None when it came from elsewhere."""
    read: list[str] = field(default_factory=list)
    """The last files inside the run's folders the rank opened for reading, oldest first."""


def write_status(run_dir: str, rank: int, status: RankStatus) -> None:
    """Atomically: a half-written status file must never read as a status."""
    path = status_path(run_dir, rank)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(asdict(status), f)
    os.replace(f"{path}.tmp", path)


def read_status(run_dir: str, rank: int) -> Optional[RankStatus]:
    """None when the rank wrote none (killed, hung, never started) or it is unreadable."""
    try:
        with open(status_path(run_dir, rank), encoding="utf-8") as f:
            data = json.load(f)
        return RankStatus(
            status=str(data["status"]),
            code=int(data.get("code", 0)),
            message=str(data.get("message", "")),
            traceback=str(data.get("traceback", "")),
            call=data["call"] if isinstance(data.get("call"), dict) else None,
            read=[str(p) for p in data.get("read") or []],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
