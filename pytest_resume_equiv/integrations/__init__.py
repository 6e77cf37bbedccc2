"""Adapters for training frameworks that own the loop (Hugging Face `Trainer`, Lightning).

Each is a callback that calls the in-rank API (`watch` once, `record` after every optimizer
step), so a trainer built on the framework needs no hand-written recording. Like everything
that runs inside ranks, nothing here imports pytest; each adapter imports its framework,
which comes with the matching extra (`pytest-resume-equiv[hf]`, `[lightning]`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional


def grad_norm(parameters: Iterable[Any]) -> Optional[float]:
    """The L2 norm of this rank's gradients (local shards under FSDP), None without any.

    Frameworks that do not hand the norm to callbacks get it from here, computed the same
    way in both runs, so it is a fair signature value even where it is not a global norm.
    """
    import torch

    total = 0.0
    seen = False
    for param in parameters:
        grad = getattr(param, "grad", None)
        if grad is None:
            continue
        local = grad.to_local() if callable(getattr(grad, "to_local", None)) else grad
        total += float(torch.linalg.vector_norm(local.detach().float())) ** 2
        seen = True
    return math.sqrt(total) if seen else None


def unwrap(obj: Any, attribute: str) -> Any:
    """The framework's own object behind an accelerate/Lightning wrapper, so its state is
    fingerprinted directly (`AcceleratedScheduler.scheduler`, `LightningOptimizer._optimizer`)."""
    inner = getattr(obj, attribute, None)
    return obj if inner is None else inner
