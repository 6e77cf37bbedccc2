"""What the plugin tells every rank of one launch, and what follows from it alone.

The plugin builds a `LaunchContext` per launch and hands it to every rank as JSON in the
variable CONTEXT_ENV names; each rank reads it back as its `RunContext` (rank/context.py: the
same fields, its rank from torchrun's variables, and the calls that need the rank's state).
One class on both sides: the schema cannot drift. The plugin's modules build launches from
this one; what a rank records (rank/context.py's `RankState`) is none of their business.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .template import fill

CONTEXT_ENV = "RESUME_EQUIV_CONTEXT"
"""Environment variable holding the JSON run context; its presence switches the API on."""

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
    crash: Optional[dict[str, Any]] = None
    """interrupt="crash": the point of the save at which every rank is killed
    (`rank/crasher.py`)."""
    picks_checkpoint: bool = False
    """A resume after a crash (checks/crash.py): the trainer finds its checkpoint itself (any
    that had completed, or none), so the automatic step numbers go on from the step its load
    restored (its optimizers' step counters; from 1 when it loaded none), not from `split`."""
    auto: bool = False
    """Automatic recording (rank/auto.py): a step line per optimizer step with no `record`
    call, and the loss, data, optimizers and schedulers beside the explicit values. False:
    only the trainer's explicit calls are recorded."""
    variant: str = ""
    """An equivalence test (`@equivalent`): the variant this launch runs ("" for the
    baseline, and in resume tests)."""
    args: tuple[str, ...] = ()
    """An equivalence test: the configuration's arguments, which command mode appends to the
    command and function mode reads here (`ctx.args`)."""
    equivalence: bool = False
    """A launch of an equivalence test, baseline or variant: automatic recording keeps the
    gradient sketch, the token counts and the dropout calls too (rank/sketch.py)."""
    dropout: str = "on"
    """off: every dropout is an identity (an equivalence test's default); on: as it is."""

    @property
    def resuming(self) -> bool:
        """True in every launch that starts from a checkpoint (also the teeth check's)."""
        return self.phase in ("resumed", "teeth")

    @property
    def process_group_backend(self) -> str:
        """The launch's backend for `init_process_group`: with an accelerator, gloo for CPU
        tensors beside it (`cpu:gloo,cuda:nccl`): DCP's `async_save` asserts a CPU backend,
        and CPU collectives need one."""
        if self.device_kind == "cpu" or self.backend == "gloo":
            return self.backend
        return f"cpu:gloo,{self.device_kind}:{self.backend}"

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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LaunchContext:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(LaunchContext)}
        data = {k: v for k, v in data.items() if k in names}
        for name in ("splits", "save_at"):
            data[name] = tuple(int(s) for s in data.get(name, ()))
        data["args"] = tuple(str(a) for a in data.get("args", ()))
        return LaunchContext(**data)
