"""The bug classes: the short names a likely cause is filed under (`Diagnosis.bug_class`), as
the bug catalogue (docs/bugs.md) and the report's `likely cause (<class>)` line say them; each
class's one fix is in fixes.py.

One name per class, and one fix per class, so a rule, a check that reacts to a class, the
catalogue and the tests cannot drift apart. A fix is a template: its parameters (`{how}`, the
call that saves and restores the stream; `{label}`, the object) come from the finding, and
where one class needs fixes that differ in substance (a batch lost at the resume, or an
epoch replayed), the finding chooses a named variant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANOTHER_STEPS_CHECKPOINT = "another step's checkpoint loaded"
BEYOND_MEASURED_NOISE = "beyond the measured noise"
BUFFERS = "buffers"
COMPUTED_DIFFERENTLY = "computed differently after an exact resume"
DATALOADER_WORKERS = "dataloader workers"
DATA_LOADER_STATE = "data loader state"
DATA_ORDER = "data order"
DRAWN_AFTER_THE_SAVE = "drawn after the save"
DEVICE_RNG = "device RNG"
FRESH_PROCESS = "resumed-process compute"
GRADIENT_ACCUMULATION = "gradient accumulation"
LEFT_IN_THE_WRONG_MODE = "left in the wrong mode"
LR_SCHEDULER_MISSING = "LR scheduler missing"
LR_SCHEDULER_OFF_BY_ONE = "LR scheduler off by one"
MARKER_BEFORE_ITS_CONTENT = "marker before its content"
MASTER_WEIGHTS = "master weights"
NEVER_RESTORED = "never restored"
NOT_FSYNCED = "not fsynced"
OPTIMIZER_STATE = "optimizer state"
OPTIMIZER_STATE_MISSING = "optimizer state missing"
OWNED_GENERATOR = "owned generator"
PER_RANK_RNG_COLLAPSED = "per-rank RNG collapsed"
REPEATED_BEFORE_THE_RESUME = "repeated before the resume"
REPLAYED_EPOCH = "replayed epoch"
RE_EXECUTED_STEPS = "re-executed steps"
RESEEDED_AFTER_LOADING = "re-seeded after loading"
RESTORED_AT_REDUCED_PRECISION = "restored at reduced precision"
RESTORED_FROM_ANOTHER_RANK = "restored from another rank"
RESTORED_FROM_ANOTHER_STEP = "restored from another step"
RESTORED_TO_AN_EARLIER_STATE = "restored to an earlier state"
RESTORED_THEN_ADVANCED = "restored then advanced"
RESTORED_TOO_LATE = "restored too late"
RESTORED_WRONG = "restored wrong"
SAVE_BLOCKED_BY_THE_CRASH = "save blocked by what the crash left"
SAVE_PAST_THE_GRACE = "save on SIGTERM past the grace"
SAVED_INSIDE_A_STEP = "saved inside a step"
SAVED_WRONG_BY_ITS_WRITER = "saved wrong by the launch that wrote it"
SIGTERM_SAVE_NOT_FOUND = "SIGTERM save not found"
SKIPPED_AGAIN = "skipped again"
TORN_CHECKPOINT = "torn checkpoint"
TRAIN_EVAL_FLAGS = "train/eval flags"
UNAUDITED_INPUT = "unaudited input"
UNAUDITED_STATE = "unaudited state"
UNKNOWN = "unknown"
WATCHED_STATE = "watched state"
WRITTEN_IN_PLACE = "written in place"

# Configuration equivalence (`@equivalent`): ../shared/BUGS.md classes 34-43
LOSS_NOT_SCALED_BY_ACCUMULATION = "loss not scaled by accumulation"
GRADIENTS_ZEROED_IN_WINDOW = "gradients zeroed inside the window"
SCHEDULER_PER_MICRO_STEP = "scheduler per micro-step"
CLIPPING_PER_MICRO_STEP = "clipping per micro-step"
TOKEN_MEAN_PER_MICRO_BATCH = "per-micro-batch token mean"
LOSS_SCALED_BY_WORLD_SIZE = "loss scaled by world size"
SAME_DATA_ON_EVERY_RANK = "same data on every rank"
PER_RANK_BATCH_STATISTICS = "per-rank batch statistics"
DRAWN_BY_CONSTRUCTION = "random draws differ by construction"
CLIPPING_ON_LOCAL_SHARDS = "clipping on local shards"
SCHEDULER_PER_RANK = "scheduler per rank"
SCHEDULER_COUNTER_ONLY = "scheduler counter only"
DATA_ORDER_BY_CONFIGURATION = "data order by configuration"

STREAM_KINDS = ("cpu", "numpy", "python")
"""The global streams a class is named after (`rng_stream`)."""
OBJECT_KINDS = ("module", "optimizer", "scheduler")
"""The objects whose every load_state_dict call the restore log sees (`kind_never_restored`)."""


def rng_stream(name: str) -> str:
    """A random stream restored wrong or not at all, by the stream's kind ("python", "numpy")."""
    return f"{name} RNG"


def kind_never_restored(kind: str) -> str:
    """A kind of state (a stream, a loader) that the resumed run never restored."""
    return f"{kind} never restored"


def rng_before_iterator(kind: str) -> str:
    """A loader's sampler seeded from a stream (`kind`) that differed before its iterator
    started: the parent stream is the cause."""
    return f"{kind} RNG before the iterator started"


@dataclass(frozen=True)
class BugClass:
    """A class: its name, its one fix (`fix`, a template over the finding's evidence) and the
    fixes of its variants, where one class has causes whose fixes differ in substance."""

    name: str
    fix: str
    variants: Mapping[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        """Its entry in docs/bugs.md's table of classes."""
        slug = "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-")
        return "bugs.md#class-" + "-".join(p for p in slug.split("-") if p)

    def fix_for(self, variant: str, evidence: Mapping[str, Any]) -> str:
        if variant and variant not in self.variants:
            raise KeyError(f"bug class {self.name!r} has no fix variant {variant!r}")
        return (self.variants[variant] if variant else self.fix).format_map(dict(evidence))
