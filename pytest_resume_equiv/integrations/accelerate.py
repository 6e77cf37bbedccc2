"""accelerate adapter: `req.watch(accelerator=accelerator)` fingerprints everything the
`Accelerator` checkpoints with `save_state`, at every step. Optional: without it every rank
records the loss of each `accelerator.backward`, the prepared model's inputs, the model,
optimizer and scheduler by itself (docs/guides/accelerate.md); it adds the objects
registered for checkpointing and the prepared data loaders.

    import pytest_resume_equiv as req

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    req.watch(accelerator=accelerator)        # before or after prepare(): read at each record
    ...
    req.record(step, sample_ids=batch["ids"])  # optional: the dataset's ids

The prepared models are watched as `model` (`model1`, ... when there are several), the
optimizers as `optimizer`, the LR schedulers as `scheduler` (accelerate's wrappers
unwrapped, so the fingerprints are of the objects `save_state` saves), the objects given to
`register_for_checkpointing` as `checkpointed` (`checkpointed1`, ...), and the prepared data
loaders as `loader` (`rank/loader.py`: their epoch / iteration, sampler generators, and with
`DataLoaderConfiguration(use_stateful_dataloader=True)` their position and worker state).
The data is accounted by the inputs' content; record the ids of the samples each step
consumes (`sample_ids=`) to have the report name them.

Nothing here needs importing: `watch` knows an `Accelerator` by itself (rank/accelerate.py);
this module names what it does and re-exports the functions.
"""

from __future__ import annotations

from ..rank.accelerate import checkpointed_objects, is_accelerator

__all__ = ["checkpointed_objects", "is_accelerator"]
