"""Runs on every node of a Slurm launch (`srun ... python -m pytest_resume_equiv.rank.slurm_agent
RUN_DIR TOKEN RDZV_ID TORCHRUN_ARGS...`), then becomes torchrun.

Two things only the nodes can do: prove they see the run directory the plugin reads back
(the token the plugin wrote before `srun`), and agree on a rendezvous endpoint without the
plugin knowing which hosts Slurm picks: node 0 binds a free port on its own host and writes
`host:port` into the run directory, the others read it. Node 0 alone hosts the c10d store
(`is_host`), so the agents do not race to host it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Callable

from .run_dir import SLURM_PROBLEM, launch_token_path, rendezvous_path

WAIT_SECONDS = float(os.environ.get("RESUME_EQUIV_SLURM_WAIT", "60"))
"""How long a node waits to see the token and node 0's endpoint (NFS attribute caches)."""


def _fail(message: str) -> None:
    print(f"{SLURM_PROBLEM} {message}", file=sys.stderr, flush=True)
    raise SystemExit(3)


def _read_when(path: str, accept: Callable[[str], bool]) -> str:
    """The file's text once `accept` takes it, or "" after WAIT_SECONDS (a missing file, or
    one an NFS attribute cache still shows as it was)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text and accept(text):
                return text
        except OSError:
            pass
        if time.monotonic() > deadline:
            return ""
        time.sleep(0.1)


def _check_shared(run_dir: str, token: str, node: str) -> None:
    if not _read_when(launch_token_path(run_dir), lambda text: text.strip() == token):
        _fail(
            f"node {node} ({socket.gethostname()}) does not see the run directory {run_dir}: "
            "every node must see it at the same path (a shared filesystem). Put the run "
            "directories there: pytest --resume-equiv-keep-dir=/shared/path/runs"
        )


def _step() -> str:
    return f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"


def _endpoint(run_dir: str, node_id: int, node: str) -> str:
    """Node 0 writes its endpoint, the others read it; tagged with this job step, so a node
    never reads the endpoint of an earlier launch in the same directory."""
    path = rendezvous_path(run_dir)
    if node_id == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        endpoint = f"{socket.gethostname()}:{port}"
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"endpoint": endpoint, "step": _step()}, f)
        os.replace(path + ".tmp", path)
        return endpoint
    text = _read_when(path, lambda text: json.loads(text).get("step") == _step())
    if not text:
        _fail(f"node {node} never saw node 0's rendezvous endpoint in {path}")
    return str(json.loads(text)["endpoint"])


def _check_one_task_per_node(torchrun_args: list[str]) -> None:
    """srun reads SLURM_NTASKS and friends from the step pytest runs in; the plugin passes
    them explicitly, and a task count that still differs would start agents that wait."""
    nnodes = next((a.split("=", 1)[1] for a in torchrun_args if a.startswith("--nnodes=")), "")
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS", "")
    if nnodes and tasks and (tasks != nnodes or os.environ.get("SLURM_LOCALID", "0") != "0"):
        _fail(
            f"this job step has {tasks} tasks (local id {os.environ.get('SLURM_LOCALID')}), "
            f"expected one per node on {nnodes} nodes: an srun option in "
            "--resume-equiv-slurm-args (--ntasks, --ntasks-per-node) overrides the plugin's"
        )


def main(argv: list[str]) -> None:
    run_dir, token, rdzv_id, torchrun_args = argv[0], argv[1], argv[2], argv[3:]
    node_id = int(os.environ.get("SLURM_NODEID", "0"))
    node = os.environ.get("SLURMD_NODENAME", str(node_id))
    _check_one_task_per_node(torchrun_args)
    _check_shared(run_dir, token, node)
    endpoint = _endpoint(run_dir, node_id, node)
    os.execv(
        sys.executable,
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=is_host={'true' if node_id == 0 else 'false'}",
            *torchrun_args,
        ],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
