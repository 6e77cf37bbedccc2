"""The vocabulary of bug classes: the short names a likely cause is filed under (`Diagnosis.bug_class`),
as the bug catalogue (docs/bugs.md) and the report's `likely cause (<class>)` line say them.

One name per class, so a rule, a check that reacts to a class and the tests cannot drift apart.
"""

from __future__ import annotations

ANOTHER_STEPS_CHECKPOINT = "another step's checkpoint loaded"
BEYOND_MEASURED_NOISE = "beyond the measured noise"
BUFFERS = "buffers"
COMPUTED_DIFFERENTLY = "computed differently after an exact resume"
DATALOADER_WORKERS = "dataloader workers"
DATA_LOADER_STATE = "data loader state"
DATA_ORDER = "data order"
DEVICE_RNG = "device RNG"
FRESH_PROCESS = "resumed-process compute"
GRADIENT_ACCUMULATION = "gradient accumulation"
LEFT_IN_THE_WRONG_MODE = "left in the wrong mode"
LR_SCHEDULER_MISSING = "LR scheduler missing"
LR_SCHEDULER_OFF_BY_ONE = "LR scheduler off by one"
MASTER_WEIGHTS = "master weights"
NEVER_RESTORED = "never restored"
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
RESTORED_THEN_ADVANCED = "restored then advanced"
RESTORED_TOO_LATE = "restored too late"
RESTORED_WRONG = "restored wrong"
SAVED_WRONG_BY_ITS_WRITER = "saved wrong by the launch that wrote it"
SKIPPED_AGAIN = "skipped again"
TORN_CHECKPOINT = "torn checkpoint"
TRAIN_EVAL_FLAGS = "train/eval flags"
UNAUDITED_INPUT = "unaudited input"
UNAUDITED_STATE = "unaudited state"
UNKNOWN = "unknown"
WATCHED_STATE = "watched state"


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
