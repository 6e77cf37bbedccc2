"""Exact, order-sensitive content fingerprints of tensors.

Two tensors get the same fingerprint only when dtype, shape and every bit of their
contents are equal, so a resume that changes one element in the last mantissa bit is seen.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
from typing import Any

SMALL_TENSOR = 16
"""Tensors with at most this many elements also store their values (readable diffs)."""


def _local(tensor: Any) -> Any:
    # DTensor (FSDP2 / tensor parallel): fingerprint this rank's shard, which is what the
    # rank owns and what its checkpoint restores.
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local):
        tensor = to_local()
    return tensor.detach()


def content_hash(tensor: Any) -> str:
    import torch

    flat = _local(tensor).reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    nbytes = flat.numel() * flat.element_size()
    digest = hashlib.blake2b(digest_size=16)
    if nbytes:
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        digest.update(ctypes.string_at(raw.data_ptr(), nbytes))
    return digest.hexdigest()


def _number(x: float) -> Any:
    # JSON has no NaN/inf: keep them readable as strings.
    return x if math.isfinite(x) else repr(x)


def describe(tensor: Any) -> dict[str, Any]:
    """dtype, shape, fingerprint and a few readable statistics of a tensor."""
    import torch

    local = _local(tensor)
    info: dict[str, Any] = {
        "dtype": str(local.dtype).replace("torch.", ""),
        "shape": list(local.shape),
        "hash": content_hash(local),
    }
    if local.numel() == 0:
        return info
    values = local.reshape(-1)
    if values.device.type != "cpu":
        values = values.cpu()
    if local.is_complex():
        values = torch.view_as_real(values).reshape(-1)
    as_double = values.to(torch.float64)
    info["stats"] = {
        "mean": _number(as_double.mean().item()),
        "min": _number(as_double.min().item()),
        "max": _number(as_double.max().item()),
        "norm": _number(as_double.norm().item()),
    }
    if values.numel() <= SMALL_TENSOR:
        info["values"] = [_number(v) for v in as_double.tolist()]
    return info
