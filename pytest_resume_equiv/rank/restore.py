"""The restore log: every call that restores state, with where in the user's code it was made.

At a resume the question is not only "what differs" but "was it restored at all, and when".
The bootstrap wraps the functions trainers restore state with (RNG setters and seeders,
`load_state_dict` of modules, optimizers, LR schedulers and grad scalers, DCP's loaders,
`torch.load`), so each call appends an entry to this rank's signature: the call, what it
restored (named as the RNG audit and `watch` name it), the first user frame, and the last step
recorded before it. Only the outermost of nested restore calls is logged (`set_state_dict`
calls `load_state_dict`). Outside a test run nothing is wrapped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Callable, Optional

from . import rng, trace

_log: list[dict[str, Any]] = []
"""Entries not yet written to the signature (the writer drains it at each line it writes)."""
_count = [0]
"""Restores logged so far in this process (a draw remembers how many came before it)."""
_depth = threading.local()
_installed: dict[str, tuple[Any, str, Any]] = {}
"""What `_wrap` replaced: (owner, attribute, original), for `uninstall`."""
_listeners: list[Callable[[dict[str, Any]], None]] = []
"""Called with each entry (the resume point starts its draw trace at a restore)."""


@contextlib.contextmanager
def unlogged() -> Iterator[None]:
    """Restore calls made by the plugin itself (seeding, the teeth check) are not the user's."""
    depth = getattr(_depth, "n", 0)
    _depth.n = depth + 1
    try:
        yield
    finally:
        _depth.n = depth


def on_restore(listener: Callable[[dict[str, Any]], None]) -> None:
    _listeners.append(listener)


SEED_CALLS = ("manual_seed", "manual_seed_all", "random.seed", "numpy.random.seed")
"""Calls that start a stream from a seed: initialization before the checkpoint is read, a
re-seeding (a bug) after it."""
LOAD_CALLS = (
    "torch.load",
    "load_file",
    "load_state_dict",
    "torch.distributed.checkpoint.load",
    "set_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
)
"""Calls that read or apply a checkpoint: the first one is where the resume begins."""


def is_seed(call: str) -> bool:
    return call.endswith(SEED_CALLS)


def is_load(call: str) -> bool:
    return call.endswith(LOAD_CALLS)


def drain() -> list[dict[str, Any]]:
    """The entries logged since the last drain, objects named now: a trainer usually loads a
    model before it calls `watch(model=...)`, and the log should say `watch:model`."""
    from .watch import name_of

    entries = []
    for entry in _log:
        what = entry["what"]
        if not isinstance(what, str):
            obj = what()
            what = name_of(obj) if obj is not None else "an object gone since"
        entries.append({**entry, "what": what})
    _log.clear()
    return entries


def count() -> int:
    return _count[0]


def log(call: str, what: Any) -> None:
    """Record one restore: `what` is the audit's name, or a weak reference to the object."""
    from .record import last_step

    entry = {"call": call, "what": what, "at": trace.user_frame(), "after_step": last_step()}
    _log.append(entry)
    _count[0] += 1
    for listener in _listeners:
        listener(entry)


def _wrap(owner: Any, attribute: str, call: str, what: Callable[..., str]) -> None:
    """Replace `owner.attribute` with a function that logs, then calls the original."""
    key = f"{id(owner)}.{attribute}"
    original = getattr(owner, attribute, None)
    if original is None or key in _installed:
        return

    @functools.wraps(original)
    def logged(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            result = original(*args, **kwargs)
        finally:
            _depth.n = depth
        if depth == 0:
            try:
                names = what(*args, **kwargs)
            except Exception:  # naming is best effort: the restore itself happened
                names = "?"
            for name in names if isinstance(names, list) else [names]:
                log(call, name)
        return result

    setattr(owner, attribute, logged)
    _installed[key] = (owner, attribute, original)


def _device_index(kind: str, args: tuple, kwargs: dict) -> str:
    device = kwargs.get("device", args[1] if len(args) > 1 else None)
    if device is None or device == kind:
        module = getattr(sys.modules["torch"], kind)
        return str(module.current_device())
    index = getattr(device, "index", device)
    return str(index if index is not None else 0)


def install_torch() -> None:
    """Wrap torch's restore functions (the bootstrap calls it once torch is imported)."""
    import torch
    import torch.optim.lr_scheduler as lr_scheduler

    for owner in (torch, torch.random):
        _wrap(owner, "set_rng_state", f"{owner.__name__}.set_rng_state", lambda *a, **k: "rng:cpu")
        _wrap(owner, "manual_seed", f"{owner.__name__}.manual_seed", lambda *a, **k: "rng:cpu")
    install_devices()
    scheduler = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    bases = [
        (torch.nn.Module, "Module"),
        (torch.optim.Optimizer, "Optimizer"),
        (scheduler, "LRScheduler"),
        (lr_scheduler.ReduceLROnPlateau, "LRScheduler"),
    ]
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        bases.append((amp.GradScaler, "GradScaler"))
    for base, kind in bases:
        _wrap_family(base, kind)
    _wrap(torch, "load", "torch.load", _file_name)
    # Not imported here: importing DCP before the user's code changes how a gloo process
    # group is torn down (seen: accelerate's DDP hanging at exit). Wrapped once imported.
    after_import("safetensors.torch", _wrap_safetensors)
    after_import("torch.distributed.checkpoint", _wrap_dcp)
    after_import("torch.distributed.checkpoint.state_dict", _wrap_dcp_helpers)


def _wrap_safetensors(module: Any) -> None:
    _wrap(module, "load_file", "safetensors.torch.load_file", _file_name)


def _wrap_dcp(module: Any) -> None:
    _wrap(module, "load", "torch.distributed.checkpoint.load", _dcp_file)


def _wrap_dcp_helpers(module: Any) -> None:
    for name in ("set_state_dict", "set_model_state_dict", "set_optimizer_state_dict"):
        _wrap(module, name, f"torch.distributed.checkpoint.state_dict.{name}", _dcp_name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls a function with a module right after it is first imported."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[Any], None]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        spec = importlib.util.find_spec(name)  # the real one (this finder no longer has it)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            real(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _AfterImport()


def after_import(name: str, hook: Callable[[Any], None]) -> None:
    """`hook(module)` now if `name` is imported, else right after its import."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    _finder.hooks[name] = hook


def uninstall() -> None:
    """Put every wrapped function back (a rank never needs it; a test process does)."""
    for owner, attribute, original in _installed.values():
        setattr(owner, attribute, original)
    _installed.clear()
    for base in _families:
        delattr(base, "__init_subclass__")
    _families.clear()
    _finder.hooks.clear()
    _log.clear()


_families: list[type] = []


def _wrap_family(base: type, kind: str) -> None:
    """`load_state_dict` of `base` and of every subclass that defines its own (LambdaLR does,
    without calling the base's), including subclasses defined later (a user's model)."""
    call = f"{kind}.load_state_dict"
    pending = [base]
    while pending:
        cls = pending.pop()
        if "load_state_dict" in cls.__dict__:
            _wrap(cls, "load_state_dict", call, _object_name)
        pending += cls.__subclasses__()
    if "__init_subclass__" in base.__dict__:
        return  # a hook of its own (none of torch's bases has one): leave it alone

    def init_subclass(cls: type, **kwargs: Any) -> None:
        super(base, cls).__init_subclass__(**kwargs)
        if "load_state_dict" in cls.__dict__:
            _wrap(cls, "load_state_dict", call, _object_name)

    base.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    _families.append(base)


def install_devices() -> None:
    """Wrap the accelerator modules' RNG setters; torch.npu appears only once torch_npu is
    imported, so this is called again at each record."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for kind in ("cuda", "npu", "xpu"):
        module = getattr(torch, kind, None)
        if module is None:
            continue
        for fn in ("set_rng_state", "manual_seed"):
            _wrap(
                module,
                fn,
                f"torch.{kind}.{fn}",
                lambda *a, _k=kind, **kw: f"rng:{_k}:{_device_index(_k, a, kw)}",
            )
        for fn in ("set_rng_state_all", "manual_seed_all"):
            _wrap(module, fn, f"torch.{kind}.{fn}", lambda *a, _k=kind, **kw: f"rng:{_k}:*")


def install_host() -> None:
    """Wrap numpy's and Python's global RNG setters (numpy only if it is imported)."""
    import random

    _wrap(random, "setstate", "random.setstate", lambda *a, **k: "rng:python")
    _wrap(random, "seed", "random.seed", lambda *a, **k: "rng:python")
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _wrap(numpy.random, "set_state", "numpy.random.set_state", lambda *a, **k: "rng:numpy")
        _wrap(numpy.random, "seed", "numpy.random.seed", lambda *a, **k: "rng:numpy")


def generator_restored(generator: Any, call: str) -> None:
    """A `torch.Generator` was seeded or given a state (rng.py's subclass); torch's own
    seeding of generators it makes (a sampler's, at each epoch) is not a restore."""
    if getattr(_depth, "n", 0) == 0 and not trace.called_from_torch(3):
        log(f"Generator.{call}", f"rng:generator {rng.identity_of(generator)}")


def _object_name(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """The object itself (weakly): it is named when the entry is written."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return type(obj).__name__


def _dcp_name(*args: Any, **kwargs: Any) -> list[Any]:
    """The models and optimizers a DCP `set_*_state_dict` helper restores."""
    torch = sys.modules["torch"]
    found = []
    for value in [*args, *kwargs.values()]:
        for obj in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
                found.append(_object_name(obj))
    return found or ["checkpoint"]


def _dcp_file(*args: Any, checkpoint_id: Any = None, storage_reader: Any = None, **kw: Any) -> str:
    path = checkpoint_id or getattr(storage_reader, "path", None)
    return f"file {os.fspath(path)}" if path else "checkpoint"


def _file_name(f: Any = None, *args: Any, **kwargs: Any) -> str:
    path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "")
    return f"file {path}" if path else "file"


def restored_names(entries: list[dict[str, Any]]) -> set[str]:
    """What a restore log says was restored (`rng:cuda:*` stands for every cuda device)."""
    return {entry["what"] for entry in entries}


def last_restore_of(entries: list[dict[str, Any]], key: str) -> Optional[dict[str, Any]]:
    """The last entry that restored the audited `key` (e.g. `rng:cpu`, `watch:model.params`)."""
    found = None
    for entry in entries:
        what = entry["what"]
        target = key.split(".")[0] if key.startswith("watch:") else key
        if what == target or (what.endswith(":*") and target.startswith(what[:-1])):
            found = entry
    return found
