"""`watch(model=..., optimizer=..., scheduler=..., **named)`: exact fingerprints of training
state at every `record`, so a divergence can be traced to the state that was not restored.

Sections per watched object: `params` / `buffers` (hash per tensor, plus its norm, mean and
largest magnitude, so a rounding-level difference can be told apart and a tolerance or a
measured noise can apply; optimizer moments the same), `modes` (modules in eval mode), and for
optimizers `lr`, `hyper`, `state` (each moment / step count) and `params` (the tensors the
optimizer updates: fp32 master weights when they are not the model's). Anything else is
stored through its `state_dict()` when it has one; a data loader by the parts a resume must
carry (`loader.py`: epoch, position, generator, workers, dataset). An accelerate `Accelerator` stands for
everything it checkpoints (rank/accelerate.py), looked up at each audit.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

from .accelerate import checkpointed_objects, is_accelerator
from .encode import encode, encode_float, state_fingerprint, tensor_fingerprint
from .fingerprint import (
    Later,
    content_hash,
    deferred,
    local_shard,
    one_transfer,
    stat_values,
    statistics,
    to_host,
)
from .layout import submodule_target, watched_name, watched_subject
from .loader import is_loader, loader_sections


class Watched:
    """The objects `watch` was given, by name; the watch section of every step line."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.found: Callable[[], dict[str, Any]] = dict
        """The objects automatic recording found (rank/auto.py), audited beside the watched
        ones: those a watched object already covers are left out, and a name the trainer
        gave to another object goes to the found one with `auto_` before it."""
        self.found_as: list[str] = []
        """The names the found objects were audited under (for the report)."""

    def watch(self, **objects: Any) -> None:
        """Fingerprint these objects at every `record` from now on (None: stop watching)."""
        for name, obj in objects.items():
            if obj is None:
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj

    def expanded(self) -> dict[str, Any]:
        """The watched objects by name, an accelerate `Accelerator` replaced by what it holds
        now (it prepares its model, optimizer and loaders after it is made)."""
        out: dict[str, Any] = {}
        for name, obj in self.objects.items():
            out.update(checkpointed_objects(obj) if is_accelerator(obj) else {name: obj})
        for name, obj in self.found().items():
            if not any(_covers(watched, obj) for watched in out.values()):
                name = name if name not in out else f"auto_{name}"
                out[name] = obj
                if name not in self.found_as:
                    self.found_as.append(name)
        return out

    def name_of(self, obj: Any) -> str:
        """How the audit names `obj`: `watch:<name>` when it is watched (or is a submodule of
        a watched module: `watch:<name> (<submodule>)`), else its class."""
        objects = self.expanded()
        for name, watched in objects.items():
            if watched is obj:
                return watched_subject(name)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.nn.Module):
            inside = list(obj.modules())
            for name, watched in objects.items():
                if not isinstance(watched, torch.nn.Module):
                    continue
                if any(m is watched for m in inside):  # a wrapper (DDP, ...) around it
                    return watched_subject(name)
                for sub, module in watched.named_modules():
                    if module is obj:
                        return submodule_target(watched_subject(name), sub)
        return type(obj).__name__

    def audit(self) -> dict[str, Any]:
        """`{"<object>.<part>": value}` for every watched object."""
        objects = self.expanded()
        if not objects:
            return {}
        torch = sys.modules["torch"]
        out: dict[str, Any] = {}
        # A parameter is watched through its module and its optimizer, and hashed once per
        # audit; never across audits, since a freed tensor's id can be reused.
        seen = _Fingerprints()
        names = _param_names(objects)
        with one_transfer() as batch:  # every device value of the audit in one copy
            for name, obj in objects.items():
                for part, value in _parts(obj, torch, seen, names).items():
                    out[watched_name(name, part)] = value
            return batch.resolve(out)


def _covers(watched: Any, found: Any) -> bool:
    """Whether a watched object already audits a found one: the same object, the optimizer
    an optimizer wrapper holds (accelerate's), or a module inside it or around it (DDP,
    FSDP). A scheduler holds its optimizer too, but audits none of its state: a watched
    scheduler leaves the optimizer audited (issue 41, case 4)."""
    if watched is found:
        return True
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(watched, torch.optim.Optimizer) and getattr(watched, "optimizer", None) is found:
        return True
    if isinstance(watched, torch.nn.Module) and isinstance(found, torch.nn.Module):
        return any(m is found for m in watched.modules()) or any(
            m is watched for m in found.modules()
        )
    return False


def shard_norm(tensor: Any) -> float:
    """The L2 norm of this rank's shard of `tensor`, in float32 or better (no float32 copy
    of it); 0.0 for an empty one, NaN for one without data (meta)."""
    values = stat_values(tensor)
    if values is None:
        return math.nan if local_shard(tensor).device.type == "meta" else 0.0
    part = statistics(values)
    return float(part.finish(to_host(part.words))[0])


def _norm_later(tensor: Any) -> Any:
    """The encoded norm of `tensor`, waiting for the audit's one copy (None without data)."""
    values = stat_values(tensor)
    if values is None:
        return None
    part = statistics(values)
    return deferred(Later(part.words, lambda words: encode_float(part.finish(words)[0])))


class _Fingerprints:
    """Fingerprints taken during one audit, by tensor identity."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, Any]] = {}

    def __call__(self, tensor: Any) -> dict[str, Any]:
        key = id(tensor)
        if key not in self.seen:
            found = tensor_fingerprint(tensor)
            # a parameter always has statistics (an integer one too: its norm)
            self.seen[key] = (
                found if isinstance(found, dict) else {"hash": found, "norm": _norm_later(tensor)}
            )
        return self.seen[key]

    def all(self, named: Any) -> dict[str, Any]:
        return {name: self(t) for name, t in named}


def _param_names(objects: dict[str, Any]) -> dict[int, str]:
    names: dict[int, str] = {}
    torch = sys.modules.get("torch")
    for obj_name, obj in objects.items():
        if torch is not None and isinstance(obj, torch.nn.Module):
            for pname, param in obj.named_parameters():
                names.setdefault(id(param), f"{obj_name}.{pname}")
    return names


def _parts(obj: Any, torch: Any, seen: _Fingerprints, names: dict[int, str]) -> dict[str, Any]:
    """The parts of one watched object, by what kind of object it is."""
    if isinstance(obj, torch.nn.Module):
        return _module(obj, seen)
    if isinstance(obj, torch.optim.Optimizer):
        return _optimizer(obj, seen, names)
    if callable(getattr(obj, "get_last_lr", None)):
        return _scheduler(obj)
    if isinstance(obj, torch.Tensor):
        return {"tensor": content_hash(obj)}
    if is_loader(obj):
        return loader_sections(obj)
    if callable(getattr(obj, "state_dict", None)):
        return {"state": state_fingerprint(obj.state_dict())}
    return {"value": state_fingerprint(obj)}


def _module(module: Any, seen: _Fingerprints) -> dict[str, Any]:
    return {
        "params": seen.all(module.named_parameters()),
        "buffers": seen.all(module.named_buffers()),
        "modes": sorted(name or "<root>" for name, m in module.named_modules() if not m.training),
    }


def _optimizer(optimizer: Any, seen: _Fingerprints, names: dict[int, str]) -> dict[str, Any]:
    torch = sys.modules["torch"]
    lr, hyper, state, params = [], [], {}, {}
    for g, group in enumerate(optimizer.param_groups):
        lr.append(encode(group.get("lr"), "lr"))
        hyper.append(
            {
                k: encode(v, k) if not isinstance(v, torch.Tensor) else content_hash(v)
                for k, v in sorted(group.items())
                if k not in ("params", "lr")
                and isinstance(v, (int, float, bool, str, tuple, list, type(None), torch.Tensor))
            }
        )
        for i, param in enumerate(group["params"]):
            name = names.get(id(param), f"group{g}.param{i}")
            params[name] = seen(param)
            entries = optimizer.state.get(param, {})
            state[name] = {
                k: tensor_fingerprint(v) if isinstance(v, torch.Tensor) else encode(v, k)
                for k, v in sorted(entries.items())
            }
    return {"lr": lr, "hyper": hyper, "state": state, "params": params}


def _scheduler(scheduler: Any) -> dict[str, Any]:
    return {
        "last_lr": [encode(float(x), "lr") for x in scheduler.get_last_lr()],
        "last_epoch": encode(getattr(scheduler, "last_epoch", None), "last_epoch"),
    }
