"""The run information a rank gets from the plugin: which phase, which steps, where to save.

The plugin builds a `LaunchContext` per launch and hands it to every rank as JSON in
RESUME_EQUIV_CONTEXT; each rank reads it back as its `RunContext` (the same fields plus its
rank from torchrun's variables). One class on both sides: the schema cannot drift.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .layout import CONTEXT_ENV
from .template import fill

PHASES = ("uninterrupted", "interrupted", "resumed", "teeth", "launch")
"""uninterrupted: runs every step and saves at each split (the determinism control's rerun
too); interrupted: the first launch of interrupt="stop"/"kill", which saves and then stops or
is killed; resumed: starts from a checkpoint; teeth: a resumed launch whose random streams
are mutated after its first step (the teeth check); launch: a `torchrun` fixture launch."""


@dataclass(frozen=True)
class LaunchContext:
    """What the plugin tells every rank of one launch."""

    phase: str
    run_dir: str
    device_kind: str = "cpu"
    backend: str = "gloo"
    seed: int = 0
    steps: int = 0
    split: int = 0
    splits: tuple[int, ...] = ()
    checkpoint: Optional[str] = None
    """The checkpoint this launch loads (resumed) or first saves (uninterrupted)."""
    checkpoint_template: Optional[str] = None
    """The user's `checkpoint=` template, unfilled; `template_values` fill it."""
    template_values: Mapping[str, Any] = field(default_factory=dict)
    """The placeholder values of the launch that writes the checkpoints."""
    save_at: tuple[int, ...] = ()
    """The steps after which this launch saves a checkpoint (`should_save`)."""
    gate: Optional[str] = None
    """A prestarted launch: the file whose existence lets the ranks run the user's code."""
    owner_pid: Optional[int] = None
    """The pytest process that started the launch; ranks leave when it is gone."""
    owner_host: Optional[str] = None
    """The host of `owner_pid`: a rank on another host (a Slurm launch) cannot watch it."""
    host_store: bool = False
    """A one-rank launch without a torchrun agent: the bootstrap holds the rendezvous store
    (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) as torchrun's agent would."""
    stacks_by_file: bool = False
    """A Slurm launch: ranks dump their stacks when the run directory's request file says so
    (a rank on another host cannot be signalled)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LaunchContext:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(LaunchContext)}
        data = {k: v for k, v in data.items() if k in names}
        for name in ("splits", "save_at"):
            data[name] = tuple(int(s) for s in data.get(name, ()))
        return LaunchContext(**data)


@dataclass(frozen=True)
class RunContext(LaunchContext):
    """What one rank of one launch needs to know; `ctx` in function mode.

    `split` is the step the resumed launch starts after; in the uninterrupted launch it is
    the first of `splits`, the steps at which the trainer must save.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def resuming(self) -> bool:
        """True in every launch that starts from a checkpoint (also the teeth check's)."""
        return self.phase in ("resumed", "teeth")

    @property
    def device(self) -> Any:
        """`torch.device` this rank should use (its local accelerator, or the CPU)."""
        import torch

        if self.device_kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_kind, self.local_rank)

    def checkpoint_for(self, step: int) -> str:
        """Where the uninterrupted launch saves the checkpoint that resumes after `step`."""
        if self.checkpoint_template is None:
            raise RuntimeError("this launch has no checkpoint template (plain torchrun launch)")
        values = {**self.template_values, "split": step}
        return fill(self.checkpoint_template, values, "checkpoint=")

    def should_save(self, step: int) -> bool:
        """True after each step at which this launch saves a checkpoint: the uninterrupted
        launch at every split, the interrupted first launch of interrupt="stop"/"kill" at its
        split, a resumed launch of a chain at the later splits."""
        return step in self.save_at

    def record(self, step: int, **values: Any) -> None:
        from .record import record

        record(step, **values)

    def init_process_group(self, **kwargs: Any) -> None:
        """`torch.distributed.init_process_group` with this launch's backend."""
        import torch.distributed as dist

        if self.device_kind != "cpu":
            getattr(__import__("torch"), self.device_kind).set_device(self.local_rank)
        dist.init_process_group(backend=self.backend, **kwargs)


_cached: Optional[RunContext] = None
_looked = False


def context() -> Optional[RunContext]:
    """The current rank's run context, or None when not running under the plugin."""
    global _cached, _looked
    if _looked:
        return _cached
    _looked = True
    raw = os.environ.get(CONTEXT_ENV)
    if not raw:
        return None
    launch = LaunchContext.from_json(raw)
    _cached = RunContext(
        **{f.name: getattr(launch, f.name) for f in dataclasses.fields(LaunchContext)},
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
    return _cached
