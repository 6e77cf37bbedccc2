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
"""

from __future__ import annotations

from typing import Any

from . import unwrap


def is_accelerator(obj: Any) -> bool:
    """An `accelerate.Accelerator`, told apart without importing accelerate."""
    return any(
        cls.__name__ == "Accelerator" and cls.__module__.startswith("accelerate")
        for cls in type(obj).__mro__
    )


def _named(prefix: str, objects: list[Any]) -> dict[str, Any]:
    return {(prefix if i == 0 else f"{prefix}{i}"): obj for i, obj in enumerate(objects)}


def checkpointed_objects(accelerator: Any) -> dict[str, Any]:
    """Name -> object for everything `accelerator.save_state` saves that can be compared."""
    models = [unwrap(m, "module") for m in accelerator._models]
    optimizers = [unwrap(o, "optimizer") for o in accelerator._optimizers]
    schedulers = [unwrap(s, "scheduler") for s in accelerator._schedulers]
    loaders = list(accelerator._dataloaders)
    return {
        **_named("model", models),
        **_named("optimizer", optimizers),
        **_named("scheduler", schedulers),
        **_named("loader", loaders),
        **_named("checkpointed", list(accelerator._custom_objects)),
    }
