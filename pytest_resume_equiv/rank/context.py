"""The run information a rank gets from the plugin: which phase, which steps, where to save."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from .layout import CONTEXT_ENV


@dataclass(frozen=True)
class RunContext:
    """What one rank of one launch needs to know; `ctx` in function mode.

    `split` is the step the resumed launch starts after; in the uninterrupted (baseline)
    launch it is the first of `splits`, the steps at which the trainer must save.
    """

    phase: str
    run_dir: str
    steps: int
    split: int
    splits: tuple[int, ...]
    checkpoint: Optional[str]
    checkpoint_template: Optional[str]
    device_kind: str
    backend: str
    seed: int
    rank: int
    local_rank: int
    world_size: int

    @property
    def resuming(self) -> bool:
        """True in every launch that starts from a checkpoint (also the teeth check's)."""
        return self.phase in ("resumed", "mutated")

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
        return self.checkpoint_template.replace("{split}", str(step))

    def should_save(self, step: int) -> bool:
        """True in a launch that writes checkpoints (the uninterrupted one, or the interrupted
        first launch of interrupt="stop"/"kill") at each split: save after this step."""
        return self.phase in ("baseline", "interrupted") and step in self.splits

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
    data = json.loads(raw)
    _cached = RunContext(
        phase=data["phase"],
        run_dir=data["run_dir"],
        steps=int(data["steps"]),
        split=int(data["split"]),
        splits=tuple(int(s) for s in data["splits"]),
        checkpoint=data.get("checkpoint"),
        checkpoint_template=data.get("checkpoint_template"),
        device_kind=data.get("device_kind", "cpu"),
        backend=data.get("backend", "gloo"),
        seed=int(data.get("seed", 0)),
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )
    return _cached
