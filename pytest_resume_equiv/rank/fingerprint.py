"""Exact, order-sensitive content fingerprints of tensors.

Two tensors get the same fingerprint only when dtype, shape and every bit of their contents
are equal, so a resume that changes one element in the last mantissa bit is seen. On CPU the
raw bytes go through xxh3 (several GB/s); on an accelerator the bits are reduced on the device
with integer arithmetic and only a few bytes cross to the host.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
from typing import Any

SMALL_TENSOR = 16
"""Tensors with at most this many elements also store their values (readable diffs)."""
HASH_CHUNK = 1 << 24
"""Bytes per piece when a large CPU tensor is hashed in pieces on several threads: the
fingerprint is the hash of the pieces' hashes, the same whatever the number of threads."""
HASH_THREADS = 4
DEVICE_CHUNK = 1 << 24
"""32-bit words reduced per device kernel launch (bounds the temporary memory)."""

try:
    import xxhash

    def hash_bytes(data: Any) -> str:
        return xxhash.xxh3_128(data).hexdigest()

except ImportError:  # pragma: no cover - xxhash is a dependency; this keeps ranks working

    def hash_bytes(data: Any) -> str:
        return hashlib.blake2b(data, digest_size=16).hexdigest()


def local_shard(tensor: Any) -> Any:
    """This rank's part of `tensor`, detached: for a DTensor (FSDP2, tensor parallel) its
    local shard, which is what the rank owns and what its checkpoint restores."""
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


@functools.cache
def _pool() -> Any:
    """The hashing threads, started on first use (a process forked after that starts its own:
    threads do not survive a fork)."""
    from concurrent.futures import ThreadPoolExecutor

    threads = min(
        HASH_THREADS,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
    )
    return ThreadPoolExecutor(max(1, threads), thread_name_prefix="resume-equiv-hash")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.cache_clear)


def _hash_pieces(data: Any) -> str:
    """xxh3 is faster than one core can read memory; several threads (it releases the GIL
    on large buffers) bring a big tensor's fingerprint close to the memory bandwidth."""
    pieces = [data[i : i + HASH_CHUNK] for i in range(0, len(data), HASH_CHUNK)]
    digests = _pool().map(lambda piece: bytes.fromhex(hash_bytes(piece)), pieces)
    return "p" + hash_bytes(b"".join(digests))


def content_hash(tensor: Any) -> str:
    flat = local_shard(tensor).reshape(-1)
    if flat.numel() == 0:
        return hash_bytes(b"")
    if flat.device.type not in ("cpu", "meta"):
        return "d" + device_digest(flat.contiguous())
    data = _cpu_bytes(flat.contiguous())
    if len(data) > HASH_CHUNK:
        return _hash_pieces(data)
    return hash_bytes(data)


def _number(x: float) -> Any:
    # JSON has no NaN/inf: keep them readable as strings.
    return x if math.isfinite(x) else repr(x)


def describe(tensor: Any) -> dict[str, Any]:
    """dtype, shape, fingerprint and a few readable statistics of a tensor."""
    import torch

    local = local_shard(tensor)
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
    # Statistics are for people to read (the hash is the exact part): float32 is precise
    # enough and several times faster than float64 over a large tensor.
    work = values if values.dtype in (torch.float32, torch.float64) else values.to(torch.float32)
    low, high = torch.aminmax(work)
    stats = torch.stack([work.mean(), low, high, torch.linalg.vector_norm(work)])
    mean, low, high, norm = stats.cpu().tolist()
    info["stats"] = {
        "mean": _number(mean),
        "min": _number(low),
        "max": _number(high),
        "norm": _number(norm),
    }
    if values.numel() <= SMALL_TENSOR:
        info["values"] = [_number(v) for v in values.to(torch.float64).cpu().tolist()]
    return info
