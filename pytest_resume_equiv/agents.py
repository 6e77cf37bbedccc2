"""How a launch's torchrun agents are started: three ways behind one small interface.

- `Standalone`: one agent on this host (`torchrun --standalone`), the usual case.
- `LocalNodes`: `nnodes` agents on this host meeting at a c10d rendezvous on a free port, a
  simulation of several nodes (`nnodes=2` without a scheduler).
- `SlurmSteps` (`--resume-equiv-launcher=slurm`): one `srun` job step with a task per node;
  inside an allocation (`SLURM_JOB_ID` set) the step runs in it, otherwise `srun` asks for an
  allocation of its own with the user's `--resume-equiv-slurm-args`. On every node
  `rank/slurm_agent.py` agrees on the rendezvous with node 0 through the run directory and
  becomes torchrun.

`RunningLaunch` (launch.py) starts the processes `argvs` returns, each in its own process
group; `cancel` is what must happen besides killing those groups (a Slurm step outlives its
`srun` when that is SIGKILLed), and `problem` reads a launcher's own failure out of the
agents' output.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING, Protocol

from .rank.layout import SLURM_PROBLEM, launch_token_path

if TYPE_CHECKING:
    from .launch import LaunchSpec

BOOTSTRAP = "pytest_resume_equiv.rank.bootstrap"
LAUNCHERS = ("local", "slurm")
SLURM_AGENT = "pytest_resume_equiv.rank.slurm_agent"
CANCEL_WAIT = 30.0
"""Seconds a cancelled Slurm launch gets to leave the queue (its processes are SIGKILLed)."""


class Agents(Protocol):
    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        """One command line per process to start (each its own process group)."""
        ...

    def cancel(self, spec: LaunchSpec) -> None:
        """Stop what killing the started processes does not (a scheduler's job step)."""
        ...

    def problem(self, agent_text: str) -> str:
        """The launcher's own explanation of a failed launch, from the agents' output."""
        ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_tail(spec: LaunchSpec) -> list[str]:
    """What every agent runs after its rendezvous options: the bootstrap and the target."""
    return [
        f"--nnodes={spec.nnodes}",
        f"--nproc-per-node={spec.nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m",
        BOOTSTRAP,
        *spec.target.argv(),
    ]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


class Standalone:
    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        # --standalone binds the rendezvous store to a free port itself and keeps it bound:
        # no window in which another test or xdist worker can take the same port.
        return [[*TORCHRUN, "--standalone", *torchrun_tail(spec)]]

    def cancel(self, spec: LaunchSpec) -> None:
        pass

    def problem(self, agent_text: str) -> str:
        return ""


class LocalNodes(Standalone):
    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        argv = [
            *TORCHRUN,
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            f"--rdzv-id={uuid.uuid4().hex}",
            "--local-addr=127.0.0.1",
            *torchrun_tail(spec),
        ]
        return [argv] * spec.nnodes


def job_name(spec: LaunchSpec) -> str:
    """The Slurm name of a launch's job (or step): unique, since every run directory is."""
    return "resume-equiv-" + uuid.uuid5(uuid.NAMESPACE_URL, spec.run_dir).hex[:16]


class SlurmSteps:
    def __init__(self, args: tuple[str, ...] = ()) -> None:
        self.args = args

    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        token = uuid.uuid4().hex
        with open(launch_token_path(spec.run_dir), "w", encoding="utf-8") as f:
            f.write(token)
        srun = [
            shutil.which("srun") or "srun",
            f"--nodes={spec.nnodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",
            f"--job-name={job_name(spec)}",
            "--label",
        ]
        if os.environ.get("SLURM_JOB_ID"):
            # Steps of one allocation share it: a prestarted launch waits at its gate
            # while the launch it depends on runs.
            srun.append("--overlap")
        agent = [sys.executable, "-m", SLURM_AGENT, spec.run_dir, token, uuid.uuid4().hex]
        return [[*srun, *self.args, *agent, *torchrun_tail(spec)]]

    def cancel(self, spec: LaunchSpec) -> None:
        """Cancel this launch's step (in an allocation) or job (its own allocation), and wait
        until Slurm has cleaned it up, so nothing of it is left when the test ends."""
        name = job_name(spec)
        mine = self._queued(name)
        for job in mine:
            if "." not in job:  # its own job: SIGKILL every process of it at once
                _quiet(["scancel", "--signal=KILL", "--full", job])
            _quiet(["scancel", job])  # a step: SIGKILL; a job: also one still pending
        deadline = time.monotonic() + CANCEL_WAIT
        while mine and time.monotonic() < deadline:
            time.sleep(0.2)
            mine = self._queued(name)

    @staticmethod
    def _queued(name: str) -> list[str]:
        """Ids of this launch's steps in the allocation, or of its own job, still queued."""
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            argv = ["squeue", "--steps", "--noheader", f"--jobs={job}", "--format=%i %j"]
        else:
            argv = ["squeue", "--noheader", f"--name={name}", "--format=%i %j"]
        ids = []
        for line in _quiet(argv).splitlines():
            found, _, found_name = line.strip().partition(" ")
            if found_name.strip() == name:
                ids.append(found)
        return ids

    def problem(self, agent_text: str) -> str:
        lines = [line for line in agent_text.splitlines() if SLURM_PROBLEM in line]
        return lines[0].split(SLURM_PROBLEM, 1)[1].strip() if lines else ""


def _quiet(argv: list[str]) -> str:
    """Run a Slurm client command; its output, or "" when it is missing or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def agents_for(spec: LaunchSpec) -> Agents:
    if spec.launcher == "slurm":
        return SlurmSteps(spec.slurm_args)
    return LocalNodes() if spec.nnodes > 1 else Standalone()
