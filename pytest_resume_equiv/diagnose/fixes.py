"""Each bug class's one fix: a template whose parameters (`{how}`, the call that saves and
restores the stream; `{label}`, the object) come from the finding, and, where one class has
causes whose fixes differ in substance (a batch lost at the resume, or an epoch replayed), the
named variants a finding chooses from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .classes import (
    ANOTHER_STEPS_CHECKPOINT,
    BEYOND_MEASURED_NOISE,
    BUFFERS,
    CLIPPING_ON_LOCAL_SHARDS,
    CLIPPING_PER_MICRO_STEP,
    COMPUTED_DIFFERENTLY,
    DATA_LOADER_STATE,
    DATA_ORDER,
    DATA_ORDER_BY_CONFIGURATION,
    DATALOADER_WORKERS,
    DEVICE_RNG,
    DRAWN_AFTER_THE_SAVE,
    DRAWN_BY_CONSTRUCTION,
    FRESH_PROCESS,
    GRADIENT_ACCUMULATION,
    GRADIENTS_ZEROED_IN_WINDOW,
    LEFT_IN_THE_WRONG_MODE,
    LOSS_NOT_SCALED_BY_ACCUMULATION,
    LOSS_SCALED_BY_WORLD_SIZE,
    LR_SCHEDULER_MISSING,
    LR_SCHEDULER_OFF_BY_ONE,
    MARKER_BEFORE_ITS_CONTENT,
    MASTER_WEIGHTS,
    NEVER_RESTORED,
    NOT_FSYNCED,
    OBJECT_KINDS,
    OPTIMIZER_STATE,
    OPTIMIZER_STATE_MISSING,
    OWNED_GENERATOR,
    PER_RANK_BATCH_STATISTICS,
    PER_RANK_RNG_COLLAPSED,
    RE_EXECUTED_STEPS,
    REPEATED_BEFORE_THE_RESUME,
    REPLAYED_EPOCH,
    RESEEDED_AFTER_LOADING,
    RESTORED_AT_REDUCED_PRECISION,
    RESTORED_FROM_ANOTHER_RANK,
    RESTORED_FROM_ANOTHER_STEP,
    RESTORED_THEN_ADVANCED,
    RESTORED_TO_AN_EARLIER_STATE,
    RESTORED_TOO_LATE,
    RESTORED_WRONG,
    SAME_DATA_ON_EVERY_RANK,
    SAVE_BLOCKED_BY_THE_CRASH,
    SAVE_PAST_THE_GRACE,
    SAVED_INSIDE_A_STEP,
    SAVED_WRONG_BY_ITS_WRITER,
    SCHEDULER_COUNTER_ONLY,
    SCHEDULER_PER_MICRO_STEP,
    SCHEDULER_PER_RANK,
    SIGTERM_SAVE_NOT_FOUND,
    SKIPPED_AGAIN,
    STREAM_KINDS,
    TOKEN_MEAN_PER_MICRO_BATCH,
    TORN_CHECKPOINT,
    TRAIN_EVAL_FLAGS,
    UNAUDITED_INPUT,
    UNAUDITED_STATE,
    UNKNOWN,
    WATCHED_STATE,
    WRITTEN_IN_PLACE,
    BugClass,
    kind_never_restored,
    rng_before_iterator,
    rng_stream,
)

SKIP_EXACTLY = "skip exactly the batches the saved steps consumed"
CLASSES: dict[str, BugClass] = {
    c.name: c
    for c in (
        BugClass(
            ANOTHER_STEPS_CHECKPOINT,
            "load the checkpoint the resume was pointed at ({given}); a newest folder or a "
            "`latest` pointer moves on as later checkpoints are written",
        ),
        BugClass(BEYOND_MEASURED_NOISE, ""),
        BugClass(
            BUFFERS,
            "save and load the whole state_dict(), buffers included, from every rank that "
            "holds its own",
        ),
        BugClass(
            COMPUTED_DIFFERENTLY,
            "save and restore that state with the checkpoint; watch() the object you suspect "
            "(or record its value) and the report names it",
        ),
        BugClass(
            DATALOADER_WORKERS,
            "restore the RNG the loader draws its base seed from before the iterator starts "
            "(or give the DataLoader a generator of its own, saved and restored)",
        ),
        BugClass(DATA_LOADER_STATE, "{fixes}"),
        BugClass(
            DATA_ORDER,
            f"{SKIP_EXACTLY} (a counter of batches saved with the checkpoint, not recomputed), "
            "and restore the loader's epoch and shuffling generator before iterating",
            {
                "lost-batch": "skip exactly the batches consumed, and save a prefetched batch "
                "(or its indices) with the checkpoint, or fetch each batch at the top of its "
                "own step",
                "replayed": "restore the loader's state before iterating (its epoch, its "
                f"shuffling generator) and {SKIP_EXACTLY}",
                "replayed-epoch": "restore the sampler's epoch before iterating "
                "(set_epoch(saved_epoch)) when its shuffle is seeded by the epoch; otherwise "
                "save the shuffling generator's state from before the epoch's permutation was "
                "drawn and set it before the iterator starts",
                "topology": "save the data position in global samples (steps x global batch), "
                "not per process, skip exactly those on any number of ranks, and restore the "
                "loader's epoch and shuffling generator before iterating",
            },
        ),
        BugClass(
            DRAWN_AFTER_THE_SAVE,
            "give that code a generator of its own (an evaluation DataLoader: "
            "DataLoader(generator=g)), so the training's stream does not depend on it, or "
            "write the checkpoint after it has run",
        ),
        BugClass(
            DEVICE_RNG,
            "save torch.{kind}.get_rng_state_all() and restore every device's with "
            "torch.{kind}.set_rng_state_all()",
        ),
        BugClass(FRESH_PROCESS, ""),
        BugClass(
            GRADIENT_ACCUMULATION,
            "save the micro-step counter, in micro-batches, with the checkpoint and restore it "
            "(or checkpoint only at an optimizer step and start the count at 0)",
            {
                "steps": "save the micro-step counter (and the accumulated gradients, or "
                "checkpoint only at an optimizer step) and restore them",
                "window": "save only at an optimizer step (where the gradients are "
                "synchronized and zeroed: accelerate's sync_gradients), or save the "
                "accumulated gradients with the checkpoint and restore them",
            },
        ),
        BugClass(
            LEFT_IN_THE_WRONG_MODE,
            "give every module the mode the uninterrupted run has there (model.train() after "
            "loading, or save and restore the flags the training changes)",
        ),
        BugClass(
            LR_SCHEDULER_MISSING,
            "save scheduler.state_dict() with the checkpoint and load it after building the "
            "scheduler",
        ),
        BugClass(
            LR_SCHEDULER_OFF_BY_ONE,
            "save the scheduler after its step; do not step it after load_state_dict",
        ),
        BugClass(MASTER_WEIGHTS, "save the optimizer's fp32 master weights and load them back"),
        BugClass(NEVER_RESTORED, "save and restore it, {how}"),
        BugClass(
            OPTIMIZER_STATE,
            "save optimizer.state_dict() after the optimizer step and load it after building "
            "the optimizer (not before a reset or a re-creation)",
        ),
        BugClass(
            OPTIMIZER_STATE_MISSING,
            "save and load optimizer.state_dict(), after the optimizer step",
        ),
        BugClass(
            OWNED_GENERATOR,
            "save its state and load it after building it, generator.get_state() / "
            "generator.set_state()",
        ),
        BugClass(
            PER_RANK_RNG_COLLAPSED,
            "save each rank's own state, keyed by its global rank, not its local rank",
        ),
        BugClass(
            REPEATED_BEFORE_THE_RESUME,
            "do not run that code again at the resume iteration (or save the checkpoint "
            "before it runs), or give that code a generator of its own",
        ),
        BugClass(
            REPLAYED_EPOCH,
            "save the generator's state from before the epoch's permutation was drawn and "
            "set_state() it before the iterator starts (after any seeding), or derive the "
            "shuffle from (seed, epoch)",
        ),
        BugClass(
            RE_EXECUTED_STEPS,
            "save the number of the next epoch to run (epoch + 1, or the step count) with the "
            "checkpoint and resume from it",
        ),
        BugClass(
            RESEEDED_AFTER_LOADING,
            "seed before loading, or restore the stream after seeding ({how})",
        ),
        BugClass(
            RESTORED_AT_REDUCED_PRECISION,
            "save the fp32 master weights instead of rebuilding them from the bf16/fp16 weights",
        ),
        BugClass(
            RESTORED_FROM_ANOTHER_RANK,
            "save each rank's own state, keyed by its global rank (a file only rank 0 writes "
            "holds only rank 0's)",
        ),
        BugClass(
            RESTORED_FROM_ANOTHER_STEP,
            "load the checkpoint saved at the split",
            {
                "rolling": "put {{split}} in the checkpoint path (one checkpoint per split), or "
                'use interrupt="stop"',
            },
        ),
        BugClass(
            RESTORED_TO_AN_EARLIER_STATE,
            "after the code that needs the earlier state has run (the epoch's shuffle re-drawn), "
            "restore {stream_words} to the state saved at the save ({how})",
        ),
        BugClass(RESTORED_THEN_ADVANCED, "{fixes}"),
        BugClass(RESTORED_TOO_LATE, "restore the stream before that code runs"),
        BugClass(
            RESTORED_WRONG,
            "save the stream's state after the step that ends at the split, next to the weights",
        ),
        BugClass(
            MARKER_BEFORE_ITS_CONTENT,
            "write the marker to a temporary file beside it, then os.replace it onto the "
            "marker's name: it exists only once whole, and a kill before the rename leaves the "
            "previous marker",
        ),
        BugClass(
            NOT_FSYNCED,
            "flush and os.fsync each file before os.replace puts it in place, then os.fsync "
            "the folder the rename (or the file's creation) happened in (fd = os.open(folder, "
            "os.O_RDONLY); os.fsync(fd)): only then does it survive a power loss",
        ),
        BugClass(
            SAVE_BLOCKED_BY_THE_CRASH,
            "make a redone save replace what a crash left: remove an existing step_k "
            "(shutil.rmtree) before os.replace(tmp-step_k, step_k), or resume from the newest "
            "complete step_k rather than only the one a pointer names",
        ),
        BugClass(
            SAVE_PAST_THE_GRACE,
            "make the save on SIGTERM fit the grace with room to spare (clusters give 30 s: "
            "Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds), and write it to a "
            "temporary and os.replace it into place, so a kill inside the grace leaves the "
            "previous checkpoint whole; or skip it and resume from the last regular save",
        ),
        BugClass(
            SAVED_INSIDE_A_STEP,
            "in the SIGTERM handler only set a flag; check it at the step boundary (after "
            "optimizer.step and the step's bookkeeping), save that step there and exit: a "
            "checkpoint must hold a whole step",
        ),
        BugClass(
            SIGTERM_SAVE_NOT_FOUND,
            "save on SIGTERM exactly as the regular saves are (the same folder layout, marker "
            "and pointer), so the resume's own search finds it, or make the resume look where "
            "the SIGTERM handler saves and take the newest complete checkpoint of either",
        ),
        BugClass(
            SAVED_WRONG_BY_ITS_WRITER,
            "take each object's state_dict() when saving, from the objects the training uses "
            "after the load",
        ),
        BugClass(
            SKIPPED_AGAIN,
            "apply the resume's skip once and reset it in the worker (or restart the workers "
            "after the first epoch)",
        ),
        BugClass(
            TORN_CHECKPOINT,
            "copy the state when the save starts (dcp.async_save stages a copy; a background "
            "torch.save needs a deep copy), or finish the write before the next step changes "
            "the tensors",
            {
                "unsure": "load the checkpoint saved at the split, and finish (or copy the "
                "state of) a save before the next step changes the tensors",
                "crash": "write each checkpoint into a temporary folder and rename it once "
                "complete, write pointer files last, and on resume load only a checkpoint that "
                "is complete",
            },
        ),
        BugClass(
            TRAIN_EVAL_FLAGS,
            "call model.train() after loading (and after any eval), or save and restore the "
            "flags the training changes",
        ),
        BugClass(
            UNAUDITED_INPUT,
            "record the batch's content (e.g. x=batch) or watch() the object, and the report "
            "names which",
            {
                "after-loading": "draw that randomness from torch's RNG or a torch.Generator, "
                "and save and restore its state with the checkpoint",
            },
        ),
        BugClass(
            UNAUDITED_STATE,
            "save and restore that state; record its inputs or watch() it, and the report "
            "names which",
        ),
        BugClass(
            UNKNOWN,
            "",
            {
                "record-ids": "to tell them apart, record each batch's sample ids "
                "(req.record(step, sample_ids=...), docs/guides/recording-more.md), or give the "
                "model its samples through a torch DataLoader, whose batches are recorded by "
                "themselves, and the report names the cause",
            },
        ),
        BugClass(
            WATCHED_STATE,
            "save '{label}''s state_dict() after the step that ends at the split and load it "
            "back into the object the training uses",
        ),
        BugClass(
            WRITTEN_IN_PLACE,
            "write the file to a temporary path beside it, flush and os.fsync it, then "
            "os.replace it onto the final path: a kill inside the write then leaves the "
            "previous file whole",
        ),
        *(
            BugClass(
                rng_stream(kind),
                "save {save} with the checkpoint and {restore} it after loading, after every "
                "seeding",
            )
            for kind in STREAM_KINDS
        ),
        BugClass(
            LOSS_NOT_SCALED_BY_ACCUMULATION,
            "divide each micro-batch's loss by the accumulation steps before `backward()` (or "
            "sum the window's per-sample losses and divide by the global batch)",
        ),
        BugClass(
            GRADIENTS_ZEROED_IN_WINDOW,
            "zero the gradients once per optimizer step, after `optimizer.step()`, never "
            "between the backwards of an accumulation window",
        ),
        BugClass(
            SCHEDULER_PER_MICRO_STEP,
            "step the LR scheduler once per optimizer step, right after `optimizer.step()`, "
            "not once per micro-batch (with accelerate: pass it to `accelerator.prepare()`, "
            "or step it under `if accelerator.sync_gradients:`)",
        ),
        BugClass(
            SCHEDULER_PER_RANK,
            "make the schedule the same on any number of ranks: build it for the steps it "
            "counts (accelerate steps a prepared scheduler once per process: HF's examples "
            "build it for `max_train_steps x num_processes`), or step it once per optimizer "
            "step yourself (`Accelerator(step_scheduler_with_optimizer=False)`, stepped under "
            "`if accelerator.sync_gradients:`)",
        ),
        BugClass(
            SCHEDULER_COUNTER_ONLY,
            'accept it with `ignore=["{key}"]` (the learning rates match), or step the '
            "scheduler once per optimizer step on any number of ranks if a resume on another "
            "topology must continue the same schedule",
        ),
        BugClass(
            DATA_ORDER_BY_CONFIGURATION,
            "shuffle with an order that depends on a seed and the epoch only, not on the number "
            "of ranks or the batching: a `DistributedSampler(seed=...)` with `set_epoch` "
            "(accelerate: `DataLoaderConfiguration(use_seedable_sampler=True)`)",
        ),
        BugClass(
            CLIPPING_PER_MICRO_STEP,
            "clip once per optimizer step, after the window's last backward and before "
            "`optimizer.step()`",
        ),
        BugClass(
            TOKEN_MEAN_PER_MICRO_BATCH,
            "divide the summed token losses by the token count of the whole global batch (the "
            "window's tokens on every rank, all-reduced), not by each micro-batch's own",
        ),
        BugClass(
            LOSS_SCALED_BY_WORLD_SIZE,
            "do not multiply (or sum) the loss by the world size: DDP and FSDP already average "
            "the gradients over the ranks",
        ),
        BugClass(
            SAME_DATA_ON_EVERY_RANK,
            "give each rank its own share of the data: a `DistributedSampler` with this "
            "rank's `rank=` and `num_replicas=` (or the dataset sharded by rank)",
        ),
        BugClass(
            PER_RANK_BATCH_STATISTICS,
            "convert BatchNorm to SyncBatchNorm (`nn.SyncBatchNorm.convert_sync_batchnorm"
            "(model)`), so that the statistics are the global batch's",
        ),
        BugClass(
            DRAWN_BY_CONSTRUCTION,
            'compare with dropout="off" (the default): masks drawn per micro-batch or per rank '
            "cannot equal the big batch's",
        ),
        BugClass(
            CLIPPING_ON_LOCAL_SHARDS,
            "clip by the whole gradient's norm: `clip_grad_norm_` on the sharded (DTensor) "
            "parameters, or the squared norms of the local shards all-reduced before the root",
        ),
        *(
            BugClass(kind_never_restored(kind), "save and load its state_dict()")
            for kind in OBJECT_KINDS
        ),
        *(
            BugClass(
                rng_before_iterator(kind),
                "before starting the iterator again, restore {parent} to the state saved "
                "before the epoch's iterator started ({how}), or give the DataLoader a "
                "generator of its own (DataLoader(generator=g)) and save and restore g's state",
            )
            for kind in STREAM_KINDS
        ),
    )
}


def fix_for(name: str, variant: str = "", evidence: Optional[Mapping[str, Any]] = None) -> str:
    """The fix of class `name` (its `variant`'s), with its parameters from `evidence`."""
    return CLASSES[name].fix_for(variant, evidence or {})
