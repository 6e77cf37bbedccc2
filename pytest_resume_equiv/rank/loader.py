"""What a data loader must carry across a resume, in parts the diagnosis can name: `epoch`
(the sampler's epoch and seed, accelerate's iteration), `position` (batches and samples
yielded in the epoch, batches to skip), `generator` (the loader's, the sampler's and the
saved sampler iterator's generator, the workers' base seed), `workers` (each worker's
dataset and fetcher state) and `dataset` (a stateful dataset's state).

Read from what the loader exposes: `torchdata`'s `StatefulDataLoader.state_dict()`, a
`DistributedSampler`'s `epoch` / `seed`, a sampler's `generator`, and accelerate's
`DataLoaderShard` / `SkipDataLoader` (`iteration`, `skip_batches`). Parts the loader does not
have are left out, so a plain `DataLoader` audits its epoch and generators only.
"""

from __future__ import annotations

import sys
from typing import Any

from .encode import state_fingerprint
from .fingerprint import content_hash

SECTIONS = ("epoch", "position", "generator", "workers", "dataset")


def is_loader(obj: Any) -> bool:
    """A `torch.utils.data.DataLoader` (StatefulDataLoader and accelerate's loaders are)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(obj, torch.utils.data.DataLoader)


def _samplers(loader: Any) -> list[tuple[str, Any]]:
    found = [("sampler", getattr(loader, "sampler", None))]
    batch = getattr(loader, "batch_sampler", None)
    inner = getattr(batch, "sampler", None)
    if inner is not found[0][1]:
        found.append(("batch_sampler.sampler", inner))
    return [(name, s) for name, s in found if s is not None]


def _generator_hash(generator: Any) -> Any:
    state = getattr(generator, "get_state", None)
    return content_hash(state()) if callable(state) else None


def _state(loader: Any) -> dict[str, Any]:
    """`StatefulDataLoader.state_dict()` flattened to one level (`_snapshot` and
    `_main_snapshot` opened), or {} for a loader without one."""
    state_dict = getattr(loader, "state_dict", None)
    if not callable(state_dict):
        return {}
    try:
        state = dict(state_dict() or {})
    except AttributeError:  # accelerate's adapter around a plain DataLoader has none
        return {}
    snapshot = state.pop("_snapshot", None) or {}
    state.update({k: v for k, v in snapshot.items() if k != "_main_snapshot"})
    state.update(snapshot.get("_main_snapshot") or {})
    return state


def loader_sections(loader: Any) -> dict[str, Any]:
    """The loader's resumable state by part; only the parts it has."""
    state = _state(loader)
    sampler_iter = state.get("_sampler_iter_state") or {}
    inner = sampler_iter.get("sampler_iter_state") or {}
    epoch: dict[str, Any] = {}
    generator: dict[str, Any] = {}
    for name, sampler in _samplers(loader):
        for attr in ("epoch", "seed"):
            value = getattr(sampler, attr, None)
            if isinstance(value, int):
                epoch[f"{name}.{attr}"] = value
        if getattr(sampler, "generator", None) is not None:
            generator[name] = _generator_hash(sampler.generator)
    if isinstance(getattr(loader, "iteration", None), int):
        epoch["iteration"] = loader.iteration  # accelerate's epoch counter
    if getattr(loader, "generator", None) is not None:
        generator["loader"] = _generator_hash(loader.generator)
    if isinstance(inner, dict) and "generator" in inner:
        generator["saved sampler iterator"] = content_hash(inner["generator"])
    if "_base_seed" in state:
        generator["workers' base seed"] = state["_base_seed"]
    position = {
        name: state[key]
        for name, key in (
            ("batches yielded", "_num_yielded"),
            ("sampler batches yielded", "_sampler_iter_yielded"),
            ("iterator finished", "_iterator_finished"),
            ("snapshot step", "_snapshot_step"),
        )
        if key in state
    }
    if isinstance(sampler_iter, dict) and "samples_yielded" in sampler_iter:
        position["samples yielded"] = sampler_iter["samples_yielded"]
    if isinstance(getattr(loader, "skip_batches", None), int):
        position["skip batches"] = loader.skip_batches  # accelerate's SkipDataLoader
    sections = {
        "epoch": epoch,
        "position": position,
        "generator": generator,
        "workers": state_fingerprint(state.get("_worker_snapshots")),
        "dataset": state_fingerprint(state.get("dataset_state")),
    }
    return {name: value for name, value in sections.items() if value not in ({}, None)}
