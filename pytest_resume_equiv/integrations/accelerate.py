"""accelerate adapter: `req.watch(accelerator=accelerator)` fingerprints everything the
`Accelerator` checkpoints with `save_state`, at every `record`.

    import pytest_resume_equiv as req

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    req.watch(accelerator=accelerator)        # before or after prepare(): read at each record
    ...
    req.record(step, loss=loss.item(), sample_ids=batch["ids"])

The prepared models are watched as `model` (`model1`, ... when there are several), the
optimizers as `optimizer`, the LR schedulers as `scheduler` (accelerate's wrappers
unwrapped, so the fingerprints are of the objects `save_state` saves), the objects given to
`register_for_checkpointing` as `checkpointed` (`checkpointed1`, ...), and the prepared data
loaders as `loader` (`rank/loader.py`: their epoch / iteration, sampler generators, and with
`DataLoaderConfiguration(use_stateful_dataloader=True)` their position and worker state).
Record the ids of the samples each step consumes (`sample_ids=`) so the data is accounted.

Nothing here needs importing: `watch` knows an `Accelerator` by itself (rank/accelerate.py);
this module names what it does and re-exports the functions.
"""

from __future__ import annotations

from ..rank.accelerate import checkpointed_objects, is_accelerator

__all__ = ["checkpointed_objects", "is_accelerator"]
