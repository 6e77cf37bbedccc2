"""One optimizer step of one configuration over its global batch: every rank's records of the
step read together (compare/configurations.py compares two configurations so), and each
rank's own (what the diagnosis of a difference reads: diagnose/at_configurations.py).

What every rank holds alike (learning rates, step counters) is read from the first rank; a
tensor's statistics over the whole of it are its replicated value or its shards' combined;
the loss of the step is what a data-parallel optimizer steps on (each rank's backward losses
summed over its micro-batches, averaged over the ranks); the gradient is the whole gradient's
norm from each rank's sketch (rank/sketch.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rank.encode import decode_float
from ..rank.layout import AUTO, WATCH, audit_key, is_audit_key, section_of, watched
from ..signature import Signature, scalar
from .accounting import BATCH_KEY, CONTENT_KEY, ids_of, is_identity_key

Run = dict[int, Signature]
EXACT_PARTS = ("lr", "last_lr", "last_epoch")
"""Watched parts every configuration must give the same at every step."""
FLOAT_PARTS = ("params", "buffers")
UNPADDED_KEY = audit_key(AUTO, "samples")
"""An equivalence launch's sample ids from each sample's unpadded tokens (rank/sketch.py):
the same under any batching, where dynamic padding changes the padded rows."""


def auto(name: str) -> str:
    return audit_key(AUTO, name)


@dataclass
class RankStep:
    """One rank's records of one step: each backward's loss, the gradient's squared norm
    before and after each backward and when the optimizer stepped, each micro-batch's token
    count, the samples, the tensors' statistics, the dropout calls."""

    losses: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    stepped: Optional[float] = None
    per_tensor: dict[str, float] = field(default_factory=dict)
    """Each parameter's stepped gradient's squared norm (its local shard's), by plain name."""
    sharded: bool = False
    tokens: list[float] = field(default_factory=list)
    samples: Counter = field(default_factory=Counter)
    tensors: dict[str, dict] = field(default_factory=dict)
    dropout: int = 0
    """Dropout calls that drew a mask (dropout kept)."""
    dropout_off: int = 0
    """Dropout calls made an identity (dropout="off")."""
    last_epochs: dict[str, Any] = field(default_factory=dict)
    """Each scheduler's `last_epoch` after the step."""

    @property
    def backwards(self) -> int:
        return len(self.losses)

    @property
    def window(self) -> Optional[float]:
        """The gradient's squared norm after the step's last backward (before any clipping)."""
        return self.after[-1] if self.after else None


@dataclass
class GlobalStep:
    """One optimizer step over every rank: what must be equal, the numbers, and the ranks'."""

    exact: dict[str, Any] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)
    samples: Counter = field(default_factory=Counter)
    ranks: dict[int, RankStep] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return sum(self.samples.values())

    def whole(self, squared: dict[int, Optional[float]]) -> Optional[float]:
        """A gradient's whole norm from each rank's squared norm: the shards' added up
        (FSDP2), else the first rank's (replicated: data parallel)."""
        values = [v for _, v in sorted(squared.items())]
        if not values or any(v is None for v in values):
            return None
        if any(r.sharded for r in self.ranks.values()):
            return math.sqrt(sum(values))
        return math.sqrt(values[0])


def global_steps(run: Run, samples_key: str) -> dict[int, GlobalStep]:
    """Every step of `run`, over its ranks."""
    steps: dict[int, GlobalStep] = {}
    first = min(run, default=0)
    for rank in sorted(run):
        for step, values in run[rank].steps:
            g = steps.setdefault(step, GlobalStep())
            own = g.ranks[rank] = _rank_step(values, samples_key)
            g.samples.update(own.samples)
            if rank == first:
                _rank_zero(g, values)
    for g in steps.values():
        ranks = list(g.ranks.values())
        if all(r.losses for r in ranks):
            g.numbers["loss"] = sum(sum(r.losses) for r in ranks) / len(ranks)
        gradient = g.whole({n: r.stepped for n, r in g.ranks.items()})
        if gradient is not None:
            g.numbers["gradient"] = gradient
        for name in sorted({k for r in ranks for k in r.per_tensor}):
            one = g.whole({n: r.per_tensor.get(name) for n, r in g.ranks.items()})
            if one is not None:
                g.numbers[f"gradient[{name!r}]"] = one
        by_name: dict[str, list[dict]] = {}
        for r in ranks:
            for name, stats in r.tensors.items():
                by_name.setdefault(name, []).append(stats)
        for name, per_rank in by_name.items():
            g.numbers.update(_whole(name, per_rank))
    return steps


def _floats(value: Any) -> list[float]:
    numbers = [scalar(v) for v in value] if isinstance(value, list) else []
    return [n for n in numbers if n is not None]


def _rank_step(values: dict[str, Any], samples_key: str) -> RankStep:
    stepped = _floats(values.get(auto("grad_stepped")))
    return RankStep(
        losses=_floats(values.get(auto("loss"))),
        before=_floats(values.get(auto("grad_before"))),
        after=_floats(values.get(auto("grad_after"))),
        stepped=stepped[0] if stepped else None,
        per_tensor=_per_tensor(values.get(auto("grad_tensors"))),
        sharded=values.get(auto("grad_sharded")) is True,
        tokens=_floats(values.get(auto("tokens"))),
        samples=Counter(ids_of(values.get(samples_key)) or []) if samples_key else Counter(),
        tensors=_tensors(values),
        dropout=_count(values.get(auto("dropout"))),
        dropout_off=_count(values.get(auto("dropout_off"))),
        last_epochs={
            watched(k)[0]: v
            for k, v in values.items()
            if section_of(k) == WATCH and watched(k)[1] == "last_epoch"
        },
    )


def _per_tensor(value: Any) -> dict[str, float]:
    numbers = {plain(k): scalar(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {k: v for k, v in numbers.items() if v is not None}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _tensors(values: dict[str, Any]) -> dict[str, dict]:
    """A rank's parameters and buffers (of the watched objects that are no optimizer), by a
    name the wrappers of another configuration do not change: their statistics."""
    optimizers = {watched(k)[0] for k in values if section_of(k) == WATCH and k.endswith(".lr")}
    found = {}
    for key, value in values.items():
        if section_of(key) != WATCH or not isinstance(value, dict):
            continue
        obj, part = watched(key)
        if part in FLOAT_PARTS and obj not in optimizers:
            for name, tensor in value.items():
                if isinstance(tensor, dict):
                    found[f"{obj}.{part}[{plain(name)!r}]"] = tensor
    return found


def magnitudes(stats: dict) -> Optional[tuple[float, float]]:
    """A tensor's (norm, absmax) from its statistics; None where either is missing. Magnitudes
    only: a mean near zero moves by a large fraction of itself under round-off."""
    norm, top = decode_float(stats.get("norm")), decode_float(stats.get("absmax"))
    return None if norm is None or top is None else (norm, top)


def _whole(name: str, per_rank: list[dict]) -> dict[str, float]:
    """A tensor's statistics over the whole of it: one rank's where every rank holds the same
    (replicated: data parallel), else its shards' combined (sharded: FSDP, each rank's
    statistics of its own shard): the norm as the root of the squares' sum, the absmax as
    the largest."""
    found = [magnitudes(t) for t in per_rank]
    if any(m is None for m in found):
        return {}
    if all(t == per_rank[0] for t in per_rank):
        norm, top = found[0]
    else:
        norm = math.sqrt(sum(m[0] * m[0] for m in found))
        top = max(m[1] for m in found)
    return {f"{name}.norm": norm, f"{name}.absmax": top}


def _rank_zero(g: GlobalStep, values: dict[str, Any]) -> None:
    """The values every rank holds alike (the first rank's): learning rates, scheduler
    counters, optimizer step counts."""
    for key, value in values.items():
        if section_of(key) != WATCH:
            continue
        obj, part = watched(key)
        if part in EXACT_PARTS:
            g.exact[key] = value
        elif part == "state" and isinstance(value, dict):
            counts = {scalar(v.get("step")) for v in value.values() if isinstance(v, dict)}
            g.exact[f"{obj}'s step count"] = sorted(c for c in counts if c is not None)


WRAPPERS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
"""Prefixes a parallel or compiled wrapper adds to a parameter's name (DDP, torch.compile,
FSDP1, activation checkpointing): the same parameter under two configurations."""


def plain(name: str) -> str:
    while True:
        for prefix in WRAPPERS:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        else:
            return name.replace("._orig_mod.", ".").replace("._fsdp_wrapped_module.", ".")


def samples_key(run: Run) -> str:
    """The identity key the samples are counted by: the trainer's sample ids, else the
    samples' unpadded tokens (a batch with a mask), else the model's inputs (every
    forward's: a window of micro-batches fetched ahead gives the loader's batches to its
    first forward only), else the batches a DataLoader yielded."""
    keys = {k for sig in run.values() for _, values in sig.steps for k in values}
    own = sorted(k for k in keys if not is_audit_key(k) and is_identity_key(k))
    if own:
        return own[0]
    return next((k for k in (UNPADDED_KEY, CONTENT_KEY, BATCH_KEY) if k in keys), "")
