"""Exact, order-sensitive content fingerprints of tensors.

Two tensors get the same fingerprint only when dtype, shape and every bit of their contents
are equal, so a resume that changes one element in the last mantissa bit is seen. On CPU the
raw bytes go through xxh3 (several GB/s); on an accelerator the bits are reduced on the device
with integer arithmetic and only a few bytes cross to the host.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
from typing import Any

SMALL_TENSOR = 16
"""Tensors with at most this many elements also store their values (readable diffs)."""
DEVICE_CHUNK = 1 << 24
"""32-bit words reduced per device kernel launch (bounds the temporary memory)."""

try:
    import xxhash

    def hash_bytes(data: Any) -> str:
        return xxhash.xxh3_128(data).hexdigest()

except ImportError:  # pragma: no cover - xxhash is a dependency; this keeps ranks working

    def hash_bytes(data: Any) -> str:
        return hashlib.blake2b(data, digest_size=16).hexdigest()


def _local(tensor: Any) -> Any:
    # DTensor (FSDP2 / tensor parallel): fingerprint this rank's shard, which is what the
    # rank owns and what its checkpoint restores.
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local):
        tensor = to_local()
    return tensor.detach()


def _cpu_bytes(flat: Any) -> Any:
    """The raw bytes of a contiguous CPU tensor, without a copy where numpy is there."""
    import torch

    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    try:
        return raw.numpy()
    except (RuntimeError, TypeError):
        return ctypes.string_at(raw.data_ptr(), raw.numel())


_MASK64 = (1 << 64) - 1


def device_digest(flat: Any) -> str:
    """Order-sensitive 128-bit digest computed where the tensor lives (integer ops only)."""
    import torch

    raw = flat.reshape(-1).view(torch.uint8)
    nbytes = raw.numel()  # part of the digest: zero padding must not make lengths collide
    pad = (-nbytes) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32)
    first = torch.zeros((), dtype=torch.int64, device=flat.device)
    second = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, words.numel(), DEVICE_CHUNK):
        chunk = words[start : start + DEVICE_CHUNK].to(torch.int64) & 0xFFFFFFFF
        idx = torch.arange(start, start + chunk.numel(), device=flat.device, dtype=torch.int64)
        # Position-dependent odd multipliers make the sum order-sensitive; int64 wraps.
        mixed = (chunk + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
        mixed = mixed ^ (mixed >> 31)
        first += mixed.sum()
        second += (mixed * ((idx << 1) | 1)).sum()
    return f"{nbytes:x}-{first.item() & _MASK64:016x}{second.item() & _MASK64:016x}"


def content_hash(tensor: Any) -> str:
    flat = _local(tensor).reshape(-1)
    if flat.numel() == 0:
        return hash_bytes(b"")
    if flat.device.type not in ("cpu", "meta"):
        return "d" + device_digest(flat.contiguous())
    return hash_bytes(_cpu_bytes(flat.contiguous()))


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
    if local.is_complex():
        values = torch.view_as_real(values).reshape(-1)
    as_double = values.to(torch.float64)
    stats = torch.stack([as_double.mean(), as_double.min(), as_double.max(), as_double.norm()])
    mean, low, high, norm = stats.cpu().tolist()
    info["stats"] = {
        "mean": _number(mean),
        "min": _number(low),
        "max": _number(high),
        "norm": _number(norm),
    }
    if values.numel() <= SMALL_TENSOR:
        info["values"] = [_number(v) for v in as_double.cpu().tolist()]
    return info
