"""What a rank needs to know about an accelerate `Accelerator` to watch it: it stands for
everything `save_state` checkpoints, which it prepares after it is made, so `watch` looks it
up at every audit. Told apart without importing accelerate, so `req.watch(accelerator=acc)`
needs nothing but the object (integrations/accelerate.py documents the names it gets).
"""

from __future__ import annotations

from typing import Any


def unwrap(obj: Any, attribute: str) -> Any:
    """The framework's own object behind an accelerate/Lightning wrapper, so its state is
    fingerprinted directly (`AcceleratedScheduler.scheduler`, `LightningOptimizer._optimizer`)."""
    inner = getattr(obj, attribute, None)
    return obj if inner is None else inner


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
        # save_state writes the GradScaler (scaler.pt) of mixed-precision fp16 training
        **_named("scaler", [s for s in [getattr(accelerator, "scaler", None)] if s is not None]),
    }
