"""What a launch is: the target every rank runs and the launch's facts (ranks, nodes, run
directory, environment, launcher). Plain data, shared by the launch machinery (launch.py) and
the launchers (agents.py) without either importing the other."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..rank.context import LaunchContext


@dataclass(frozen=True)
class Target:
    """What each rank runs: a script path, a module (`-m`), or a module-level function."""

    kind: str  # "script" | "module" | "call"
    name: str
    args: tuple[str, ...] = ()
    pythonpath: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [f"--{self.kind}", self.name, *self.args]


@dataclass(frozen=True)
class LaunchSpec:
    name: str
    target: Target
    run_dir: str
    nproc: int
    nnodes: int
    timeout: float
    context: LaunchContext
    """What every rank is told (JSON in RESUME_EQUIV_CONTEXT)."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    launcher: str = "local"
    """How the agents start (agents.py): "local" (this host) or "slurm" (job steps)."""
    slurm_args: tuple[str, ...] = ()
    """`--resume-equiv-slurm-args`: given to every `srun`."""
    fork_server: bool = False
    """`--resume-equiv-fork-server=on`: fork the ranks from the session's server if the
    launch allows it (forked.py)."""
    preload: tuple[str, ...] = ()
    """`--resume-equiv-preload`: what that server imports before it forks."""
    lease_env: dict[str, str] = field(default_factory=dict)
    """The visible-devices variables of the devices leased for this launch (also in `env`):
    simulated node k of a launch on one host sees the k-th `nproc` of them."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def default_env() -> dict[str, str]:
    """What every launch adds to the inherited environment before its own variables (the
    fork server starts with it too)."""
    extra = {"PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        extra["OMP_NUM_THREADS"] = "1"  # what torchrun sets anyway, without its warning
    return extra
