"""Adapters for training frameworks that own the loop (Hugging Face `Trainer`, Lightning).

A trainer built on one needs none of them: every rank records each optimizer step by
itself (rank/auto.py: the loss of each backward, the outermost module's inputs, the
optimizers, schedulers and model the framework built). Each callback adds only the values in
the framework's own terms (what it logs: loss, lr, grad_norm) and the objects no optimizer
holds, given as keywords (an EMA); the guides (docs/guides/hf-trainer.md, lightning.md,
accelerate.md) name what each framework gets automatically. Like everything
that runs inside ranks, nothing here imports pytest; each adapter imports its framework,
which comes with the matching extra (`pytest-resume-equiv[hf]`, `[lightning]`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional

from ..rank.accelerate import unwrap
from ..rank.watch import shard_norm

__all__ = ["grad_norm", "unwrap"]


def grad_norm(parameters: Iterable[Any]) -> Optional[float]:
    """The L2 norm of this rank's gradients (local shards under FSDP), None without any.

    Frameworks that do not hand the norm to callbacks get it from here, computed the same
    way in both runs, so it is a fair signature value even where it is not a global norm.
    """
    grads = [p.grad for p in parameters if getattr(p, "grad", None) is not None]
    return math.sqrt(sum(shard_norm(g) ** 2 for g in grads)) if grads else None
