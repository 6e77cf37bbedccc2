"""How a launch's torchrun agents are started: four ways behind one small interface.

- `OneRank`: a one-rank launch runs its rank directly, with the variables torchrun gives a
  worker; the rank holds the rendezvous store an agent would (no agent's `import torch`).
- `Standalone`: one agent on this host (`torchrun --standalone`).
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

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Callable, Optional

from ..errors import ResumeEquivError
from ..rank.run_dir import SLURM_PROBLEM, launch_token_path, rendezvous_path, stacks_request_path
from .devices import node_slice
from .spec import LaunchSpec, SlurmLauncher

BOOTSTRAP = "pytest_resume_equiv.rank.bootstrap"
SLURM_AGENT = "pytest_resume_equiv.rank.slurm_agent"
SRUN_CONSEQUENCE = re.compile(r"task \d+:|Terminating|CANCELLED|Killed|Timed out")
"""srun's lines about tasks that ended because the launch was stopped: not its cause."""
CANCEL_WAIT = 30.0
"""Seconds a cancelled Slurm launch gets to leave the queue (its processes are SIGKILLed)."""


class Agents:
    """The interface, with what a launcher that needs nothing more does."""

    host_store = False
    """The started process is the rank itself: the bootstrap holds the rendezvous store."""
    stacks_by_file = False
    """Ranks may be on other hosts: they dump their stacks when the run directory asks."""
    preexec: Optional[Callable[[], None]] = None
    """Run in each started process before it execs (after it left pytest's session)."""
    note = ""
    """How this launch starts when that is not the usual way (shown with -v)."""

    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        """One command line per process to start (each its own process group)."""
        raise NotImplementedError

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        """Variables the started processes get besides the launch's own."""
        return {}

    def node_env(self, spec: LaunchSpec, node: int) -> dict[str, str]:
        """Variables only the `node`-th started process gets (over the launch's own)."""
        return {}

    def cancel(self, spec: LaunchSpec) -> None:
        """Stop what killing the started processes does not (a scheduler's job step)."""

    def problem(self, agent_text: str) -> str:
        """The launcher's own explanation of a failed launch, from the agents' output."""
        return ""

    def exitcodes(self, returncodes: list[Optional[int]]) -> dict[int, int]:
        """rank -> exit code where the processes started are the ranks themselves; else the
        agents' own summary says (outcomes.py reads it)."""
        return {}

    def supervise(self, procs: list) -> None:
        """Called while the launch runs: what an agent does for ranks started without one."""

    def next_look(self) -> float:
        """When `supervise` must be called again though no process exited (monotonic)."""
        return math.inf


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


class Standalone(Agents):
    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        # --standalone binds the rendezvous store to a free port itself and keeps it bound:
        # no window in which another test or xdist worker can take the same port.
        return [[*TORCHRUN, "--standalone", *torchrun_tail(spec)]]


class OneRank(Agents):
    """One rank on this host, without a torchrun agent: the agent's only work would be to hold
    the rendezvous store and wait, and its `import torch` costs seconds of CPU per launch.
    The rank gets the variables torchrun gives a worker, and the bootstrap holds the store
    (`host_store`), bound to a port of its own choosing, as torchrun's agent would."""

    host_store = True

    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        return [[sys.executable, "-m", BOOTSTRAP, *spec.target.argv()]]

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        return rank_env(spec, 0)

    def exitcodes(self, returncodes: list[Optional[int]]) -> dict[int, int]:
        code = returncodes[0] if returncodes else None
        return {} if code is None else {0: code}


def rank_env(spec: LaunchSpec, rank: int) -> dict[str, str]:
    """What torchrun's agent gives worker `rank` of a one-node launch (the store's address
    is added by rank 0, which holds it)."""
    n = str(spec.nproc)  # one node: every rank is local
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": n,
        "LOCAL_WORLD_SIZE": n,
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": n,
        "TORCHELASTIC_RUN_ID": uuid.uuid5(uuid.NAMESPACE_URL, spec.run_dir).hex,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_ERROR_FILE": os.path.join(spec.run_dir, "logs", f"error-{rank}.json"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


class LocalNodes(Agents):
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

    def node_env(self, spec: LaunchSpec, node: int) -> dict[str, str]:
        """Each simulated node its own `nproc` of the leased devices: with the whole list,
        local rank 0 of every node would take the same device, which NCCL refuses
        ("Duplicate GPU detected")."""
        return node_slice(spec.lease_env, spec.nproc, node)


def job_name(spec: LaunchSpec) -> str:
    """The Slurm name of a launch's job (or step): unique, since every run directory is."""
    return "resume-equiv-" + uuid.uuid5(uuid.NAMESPACE_URL, spec.run_dir).hex[:16]


class SlurmSteps(Agents):
    stacks_by_file = True

    def __init__(self, args: tuple[str, ...] = ()) -> None:
        self.args = args

    def argvs(self, spec: LaunchSpec) -> list[list[str]]:
        srun = shutil.which("srun")
        if srun is None:
            raise ResumeEquivError(
                "--resume-equiv-launcher=slurm: srun is not on PATH; run pytest where the "
                "Slurm client commands are (a login or compute node), or use the local launcher"
            )
        token = uuid.uuid4().hex
        with open(launch_token_path(spec.run_dir), "w", encoding="utf-8") as f:
            f.write(token)
        with open(stacks_request_path(spec.run_dir), "w"):
            pass  # there from the start: a node's NFS cache never holds its absence
        with contextlib.suppress(FileNotFoundError):
            os.remove(rendezvous_path(spec.run_dir))  # a rerun never reads an old endpoint
        argv = [
            srun,
            # explicit: srun reads SLURM_NTASKS and friends of the step pytest runs in
            f"--nodes={spec.nnodes}",
            f"--ntasks={spec.nnodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",
            f"--job-name={job_name(spec)}",
            "--label",
        ]
        if os.environ.get("SLURM_JOB_ID"):
            # Steps of one allocation share it: a prestarted launch waits at its gate
            # while the launch it depends on runs.
            argv.append("--overlap")
        agent = [sys.executable, "-m", SLURM_AGENT, spec.run_dir, token, uuid.uuid4().hex]
        return [[*argv, *self.args, *agent, *torchrun_tail(spec)]]

    def cancel(self, spec: LaunchSpec) -> None:
        """Cancel this launch's step (in an allocation) or job (its own allocation, pending or
        running), and wait until Slurm has cleaned it up, so nothing of it is left."""
        name = job_name(spec)
        if not os.environ.get("SLURM_JOB_ID"):
            _quiet(["scancel", "--me", f"--name={name}", "--signal=KILL", "--full"])
            _quiet(["scancel", "--me", f"--name={name}"])  # one still pending, too
        deadline = time.monotonic() + CANCEL_WAIT
        while time.monotonic() < deadline:
            mine = self._queued(name)
            if mine == []:
                return
            for step in [s for s in mine or () if "." in s]:
                _quiet(["scancel", "--signal=KILL", step])
                _quiet(["scancel", step])
            time.sleep(0.5)

    @staticmethod
    def _queued(name: str) -> Optional[list[str]]:
        """Ids of this launch's steps in the allocation, or of its own job, still queued;
        None when squeue did not answer (a busy controller: ask again)."""
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            argv = ["squeue", "--steps", "--noheader", f"--jobs={job}", "--format=%i %j"]
        else:
            argv = ["squeue", "--me", "--noheader", f"--name={name}", "--format=%i %j"]
        listing = _quiet(argv)
        if listing is None:
            return None
        ids = []
        for line in listing.splitlines():
            found, _, found_name = line.strip().partition(" ")
            if found_name.strip() == name:
                ids.append(found)
        return ids

    def problem(self, agent_text: str) -> str:
        """The node agent's own account, else srun's errors (a bad partition or account)."""
        lines = [line for line in agent_text.splitlines() if SLURM_PROBLEM in line]
        if lines:
            return lines[0].split(SLURM_PROBLEM, 1)[1].strip()
        errors = [
            line.strip()
            for line in agent_text.splitlines()
            if "srun: error:" in line and not SRUN_CONSEQUENCE.search(line)
        ]
        return "; ".join(dict.fromkeys(errors[:3]))

    @staticmethod
    def preexec() -> None:
        """In srun's child before exec: if pytest dies (SIGKILL, a cancelled CI job), the
        kernel sends srun SIGTERM, and srun ends its step or job on every node."""
        if sys.platform.startswith("linux"):
            _parent_death_signal(signal.SIGTERM)


def _parent_death_signal(sig: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _quiet(argv: list[str]) -> Optional[str]:
    """Run a Slurm client command; its output, or None when it is missing or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def launcher_agents(spec: LaunchSpec) -> Agents:
    """The agents `spec`'s launcher starts it with: Slurm job steps, one agent per simulated
    node on this host, the rank alone, or `torchrun --standalone`."""
    if isinstance(spec.launcher, SlurmLauncher):
        return SlurmSteps(spec.launcher.args)
    if spec.nnodes > 1:
        return LocalNodes()
    return OneRank() if spec.nproc == 1 else Standalone()
