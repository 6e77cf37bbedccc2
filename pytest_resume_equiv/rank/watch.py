"""`watch(model=..., optimizer=..., scheduler=..., **named)`: exact fingerprints of training
state at every `record`, so a divergence can be traced to the state that was not restored.

Sections per watched object: `params` / `buffers` (hash per tensor, plus norms so a
rounding-level difference can be told apart), `modes` (modules in eval mode), and for
optimizers `lr`, `hyper`, `state` (each moment / step count) and `params` (the tensors the
optimizer updates: fp32 master weights when they are not the model's). Anything else is
stored through its `state_dict()` when it has one; a data loader by the parts a resume must
carry (`loader.py`: epoch, position, generator, workers, dataset). An accelerate `Accelerator` stands for
everything it checkpoints (integrations/accelerate.py), looked up at each audit.
"""

from __future__ import annotations

import sys
from typing import Any

from .encode import encode, encode_float, state_fingerprint
from .fingerprint import content_hash, local_shard
from .loader import is_loader, loader_sections

_watched: dict[str, Any] = {}


def watch(**objects: Any) -> None:
    """Fingerprint these objects at every `record` from now on (a no-op outside a test run)."""
    from .context import context

    if context() is None:
        return
    for name, obj in objects.items():
        if obj is None:
            _watched.pop(name, None)
        else:
            _watched[name] = obj


def shard_norm(tensor: Any) -> float:
    """The L2 norm of this rank's shard of `tensor`, in float32 or better."""
    import torch

    local = local_shard(tensor)
    if local.dtype not in (torch.float32, torch.float64):
        local = local.to(torch.float32)
    return float(torch.linalg.vector_norm(local)) if local.numel() else 0.0


def _norm(tensor: Any) -> Any:
    return encode_float(shard_norm(tensor))


_seen: dict[int, dict[str, Any]] = {}
"""Fingerprints taken during the current audit, by tensor identity: a parameter is watched
through its module and its optimizer, and hashed once."""


def _fingerprint(tensor: Any) -> dict[str, Any]:
    key = id(tensor)
    if key not in _seen:
        _seen[key] = {"hash": content_hash(tensor), "norm": _norm(tensor)}
    return _seen[key]


def _tensors(named: Any) -> dict[str, Any]:
    return {name: _fingerprint(t) for name, t in named}


def _objects() -> dict[str, Any]:
    """The watched objects by name, an accelerate `Accelerator` replaced by what it holds now
    (it prepares its model, optimizer and loaders after it is made)."""
    from ..integrations.accelerate import checkpointed_objects, is_accelerator

    out: dict[str, Any] = {}
    for name, obj in _watched.items():
        out.update(checkpointed_objects(obj) if is_accelerator(obj) else {name: obj})
    return out


def name_of(obj: Any) -> str:
    """How the audit names `obj`: `watch:<name>` when it is watched (or is a submodule of a
    watched module: `watch:<name> (<submodule>)`), else its class."""
    objects = _objects()
    for name, watched in objects.items():
        if watched is obj:
            return f"watch:{name}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        inside = list(obj.modules())
        for name, watched in objects.items():
            if not isinstance(watched, torch.nn.Module):
                continue
            if any(m is watched for m in inside):  # a wrapper (DDP, ...) around it
                return f"watch:{name}"
            for sub, module in watched.named_modules():
                if module is obj:
                    return f"watch:{name} ({sub})"
    return type(obj).__name__


def _param_names(objects: dict[str, Any]) -> dict[int, str]:
    names: dict[int, str] = {}
    torch = sys.modules.get("torch")
    for obj_name, obj in objects.items():
        if torch is not None and isinstance(obj, torch.nn.Module):
            for pname, param in obj.named_parameters():
                names.setdefault(id(param), f"{obj_name}.{pname}")
    return names


def _module(module: Any) -> dict[str, Any]:
    return {
        "params": _tensors(module.named_parameters()),
        "buffers": _tensors(module.named_buffers()),
        "modes": sorted(name or "<root>" for name, m in module.named_modules() if not m.training),
    }


def _optimizer(optimizer: Any, names: dict[int, str]) -> dict[str, Any]:
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
            params[name] = _fingerprint(param)
            entries = optimizer.state.get(param, {})
            state[name] = {
                k: content_hash(v) if isinstance(v, torch.Tensor) else encode(v, k)
                for k, v in sorted(entries.items())
            }
    return {"lr": lr, "hyper": hyper, "state": state, "params": params}


def _scheduler(scheduler: Any) -> dict[str, Any]:
    return {
        "last_lr": [encode(float(x), "lr") for x in scheduler.get_last_lr()],
        "last_epoch": encode(getattr(scheduler, "last_epoch", None), "last_epoch"),
    }


def audit() -> dict[str, Any]:
    """`{"<object>.<section>": value}` for every watched object."""
    if not _watched:
        return {}
    torch = sys.modules["torch"]
    objects = _objects()
    out: dict[str, Any] = {}
    _seen.clear()
    try:
        _audit_into(out, torch, objects, _param_names(objects))
    finally:
        _seen.clear()  # never keep ids across steps: a freed tensor's id can be reused
    return out


def _audit_into(
    out: dict[str, Any], torch: Any, objects: dict[str, Any], names: dict[int, str]
) -> None:
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            sections = _module(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            sections = _optimizer(obj, names)
        elif callable(getattr(obj, "get_last_lr", None)):
            sections = _scheduler(obj)
        elif isinstance(obj, torch.Tensor):
            sections = {"tensor": content_hash(obj)}
        elif is_loader(obj):
            sections = loader_sections(obj)
        elif callable(getattr(obj, "state_dict", None)):
            sections = {"state": state_fingerprint(obj.state_dict())}
        else:
            sections = {"value": state_fingerprint(obj)}
        for section, value in sections.items():
            out[f"{name}.{section}"] = value
