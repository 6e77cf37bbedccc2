"""What a launch is: the target every rank runs and the launch's facts (ranks, nodes, run
directory, environment, launcher). Plain data, shared by the launch machinery (launch.py) and
the launchers (agents.py) without either importing the other; what a launcher means
for the rest of the plugin is here too, since every launch carries its launcher."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ..rank.launch_context import LaunchContext


@dataclass(frozen=True)
class Launcher:
    """What a launcher (`--resume-equiv-launcher`) means for the rest of the plugin, so that
    no other module decides from its name: whether the plugin leases accelerators for a
    launch, how many accelerator launches may run at once, what the report header says.
    Which agents start a launch is `agents.launcher_agents`. Made once from the options
    (`launcher_named`), it travels with each launch's spec."""

    name: str = "local"
    args: tuple[str, ...] = ()
    """`--resume-equiv-slurm-args`: given to every `srun` (Slurm only)."""
    leases_devices: ClassVar[bool] = True
    """The plugin leases a launch's accelerators itself (else the scheduler does, by GRES)."""
    one_accelerator_launch: ClassVar[bool] = False
    """Accelerator launches run one at a time (every job step sees the whole allocation)."""
    can_fork: ClassVar[bool] = True
    """A one-node launch may be forked from the session's fork server (forked.py)."""

    def __str__(self) -> str:
        return self.name

    def header(self, described: str) -> str:
        """What the report header adds about this launcher ("" for the default)."""
        return ""

    def devices_per_host(self, nproc: int, nnodes: int) -> int:
        """The devices a launch of `nnodes` nodes of `nproc` ranks uses on this host: all
        of them, since this launcher simulates every node here."""
        return nproc * nnodes


@dataclass(frozen=True)
class SlurmLauncher(Launcher):
    name: str = "slurm"
    leases_devices: ClassVar[bool] = False
    one_accelerator_launch: ClassVar[bool] = True
    can_fork: ClassVar[bool] = False

    def header(self, described: str) -> str:
        job = os.environ.get("SLURM_JOB_ID")
        where = f"steps of job {job}" if job else "an allocation per launch"
        return f", launcher={described}: {where}"

    def devices_per_host(self, nproc: int, nnodes: int) -> int:
        """Each node of the allocation is a host of its own."""
        return nproc


LAUNCHER_TYPES: dict[str, type[Launcher]] = {"local": Launcher, "slurm": SlurmLauncher}
LAUNCHERS = tuple(LAUNCHER_TYPES)


def launcher_named(name: str, args: tuple[str, ...] = ()) -> Launcher:
    """The launcher a (validated) `--resume-equiv-launcher` value names."""
    return LAUNCHER_TYPES[name](args=tuple(args))


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
    launcher: Launcher = field(default_factory=Launcher)
    """How the agents start (agents.py): on this host, or as Slurm job steps."""
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
