"""The batches a torch DataLoader yields, seen where they leave the loader: the samples a step
was given, told apart from what the trainer did to them afterwards.

A model's inputs are not always the samples: a diffusion trainer adds noise to the latents in
its loop, a trainer augments or masks a batch after the loader. Their content then says nothing
of which samples they were, and a data-order bug looks like other content. The loader's own
batch does: each sample is hashed as the model's inputs are (rank/inputs.py `batch_parts`, one id
per row of every batched tensor), from the batch the iterator returned.

Every loader's iterator is a `torch.utils.data.dataloader._BaseDataLoaderIter` (the single- and
multi-process ones, torchdata's `StatefulDataLoader`, whose `__next__` calls it): its `__next__`
is where a batch is yielded, for a plain DataLoader, accelerate's `DataLoaderShard` (which
iterates its base loader's iterator before moving the batch to the device), Lightning's and
HF Trainer's loops.

Which batch a step consumed: the batch yielded last before each outermost training forward,
taken by that forward (a forward with no new batch since the last one takes none). So a
loader that fetches one batch ahead (accelerate's) gives, at every step of every run, the one
fetched ahead; a resume that skips batches by iterating them (a skip loop) takes only the one
fetched last; an evaluation loader's batches are never taken by a training forward. Hashed
only when taken (no cost for skipped or evaluation batches), in place: a CPU batch is read
where it lies, a device batch is reduced on its device.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from .patches import Patches

ITER_MODULE = "torch.utils.data.dataloader"
ITER_CLASS = "_BaseDataLoaderIter"


class SampleList(list):
    """A list of tensors, one per sample: what a collate function leaves unstacked (latents of
    different shapes, one per video; a DiT's list arguments). Each item is one sample."""


def batch_tensors(
    value: Any, path: str = "", mapping: type = Mapping, samples: bool = False
) -> Iterator[tuple[str, Any]]:
    """The tensors of a batch with where they were (`0`, `input_ids`, `0.x`): tuples, lists,
    mappings (a dict, HF's `BatchEncoding`) and dataclasses, nested, in a stable order. A list
    made of tensors only, held by a name (a mapping's key, a dataclass field, a keyword
    argument) or given as an argument (`samples`), is one `SampleList`: a sample per item,
    whatever their shapes. Elsewhere a list is fields, as default_collate makes of a
    dataset's tuples ([x, y], each with a row per sample). A forward's arguments are read
    with `mapping=dict` (rank/auto.py): only plain dicts are opened there."""
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        yield path, value
    elif samples and isinstance(value, list) and _all_tensors(value, torch):
        yield path, SampleList(value)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from batch_tensors(item, _join(path, i), mapping)
    elif isinstance(value, mapping):
        for key in sorted(value, key=str):
            yield from batch_tensors(value[key], _join(path, key), mapping, True)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from batch_tensors(
                getattr(value, item.name), _join(path, item.name), mapping, True
            )


def _all_tensors(items: list, torch: Any) -> bool:
    return bool(items) and all(isinstance(item, torch.Tensor) for item in items)


def _join(path: str, name: Any) -> str:
    return f"{path}.{name}" if path else str(name)


class LoaderTap:
    """Wraps `_BaseDataLoaderIter.__next__`: keeps the batch yielded last until a training
    forward takes it (`take`)."""

    def __init__(self) -> None:
        self.pending: Optional[Any] = None
        """The batch yielded last and not yet taken (a reference, not a copy)."""
        self.yielded = False
        """A batch was yielded since the last `take` (None is a batch too)."""
        self.seen = False
        """Some loader yielded a batch in this process."""
        self._patches = Patches(__name__)

    def install(self) -> None:
        """Wrap the iterators' `__next__` (torch must be imported)."""
        import importlib

        owner = getattr(importlib.import_module(ITER_MODULE), ITER_CLASS, None)
        original = getattr(owner, "__next__", None)
        if owner is None or original is None or self._patches.replaced:
            return
        tap = self

        def __next__(iterator: Any) -> Any:
            batch = original(iterator)
            tap.pending, tap.yielded, tap.seen = batch, True, True
            return batch

        self._patches.replace(owner, "__next__", __next__)

    def uninstall(self) -> None:
        self._patches.restore()
        self.pending, self.yielded = None, False

    def take(self) -> Optional[list[tuple[str, Any]]]:
        """The tensors of the batch yielded since the last take (None: no batch yielded since,
        or one with no tensor), released."""
        if not self.yielded:
            return None
        batch, self.pending, self.yielded = self.pending, None, False
        tensors = list(batch_tensors(batch))
        return tensors or None
