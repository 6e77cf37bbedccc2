"""Exact, order-sensitive content fingerprints of tensors.

Two tensors get the same fingerprint only when dtype, shape and every bit of their contents
are equal, so a resume that changes one element in the last mantissa bit is seen. On CPU the
raw bytes go through xxh3 (several GB/s); on an accelerator the bits are reduced on the device
with integer arithmetic and only a few bytes cross to the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import os
import struct
import threading
from collections.abc import Iterator
from typing import Any, Callable, Union

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


def cpu_bytes(flat: Any) -> Any:
    """The raw bytes of a contiguous CPU tensor, without a copy where numpy is there.

    numpy is not a dependency (torch runs without it, and `Tensor.numpy()` then raises
    "Numpy is not available"): without it the bytes are copied once."""
    import torch

    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    try:
        return raw.numpy()
    except (RuntimeError, TypeError):
        return ctypes.string_at(raw.data_ptr(), raw.numel())


_MASK64 = (1 << 64) - 1
NO_DATA = "meta (no data)"
"""The fingerprint of a tensor without storage (device `meta`: what a model offloaded with
accelerate's `device_map` holds between forwards). Reading its address would be a crash."""


class Later:
    """A part of a fingerprint still on its device: `words` (int64, 1-D) cross to the host
    with every other part of the same audit in one copy per device (`one_transfer`), then
    `finish` turns them into the JSON value. Several parts may share one `words` tensor."""

    __slots__ = ("words", "finish")

    def __init__(self, words: Any, finish: Callable[[list[int]], Any]) -> None:
        self.words = words
        self.finish = finish


Fingerprint = Union[str, Later]
"""A content hash as the audit keeps it: a string, or one still on its device inside a batch."""


class Transfers:
    """The device values of one audit (`one_transfer`): each device's `Later` parts are
    concatenated and copied to the host once, then put in place of the placeholders."""

    def __init__(self) -> None:
        self.parts: list[Later] = []

    def add(self, part: Later) -> Later:
        self.parts.append(part)
        return part

    def resolve(self, tree: Any) -> Any:
        """`tree` with every `Later` in it replaced by its value."""
        if not self.parts:
            return tree
        import torch

        by_device: dict[Any, list[Any]] = {}
        seen: set[int] = set()
        for part in self.parts:
            if id(part.words) not in seen:
                seen.add(id(part.words))
                by_device.setdefault(part.words.device, []).append(part.words)
        host: dict[int, list[int]] = {}
        for tensors in by_device.values():
            flat = to_host(torch.cat(tensors) if len(tensors) > 1 else tensors[0])
            at = 0
            for tensor in tensors:
                host[id(tensor)] = flat[at : at + tensor.numel()]
                at += tensor.numel()
        values = {id(part): part.finish(host[id(part.words)]) for part in self.parts}
        self.parts = []
        return _replace(tree, values)


def _replace(tree: Any, values: dict[int, Any]) -> Any:
    if isinstance(tree, Later):
        return values[id(tree)]
    if isinstance(tree, dict):
        return {key: _replace(value, values) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_replace(value, values) for value in tree]
    if isinstance(tree, tuple):
        return tuple(_replace(value, values) for value in tree)
    return tree


def to_host(words: Any) -> list[int]:
    """The one place where fingerprint data crosses from a device to the host (a sync on an
    accelerator); benchmarks/bench_audit_syncs.py counts the calls."""
    return words.cpu().tolist()


_open = threading.local()


@contextlib.contextmanager
def one_transfer() -> Iterator[Transfers]:
    """Defer the device parts of the fingerprints taken inside to one copy per device;
    `resolve` the result with the batch this yields. Nested: the outermost batch copies
    (an inner `resolve` leaves the placeholders for it)."""
    outer = getattr(_open, "batch", None)
    if outer is not None:
        yield _Inner()
        return
    batch = Transfers()
    _open.batch = batch
    try:
        yield batch
    finally:
        _open.batch = None


class _Inner(Transfers):
    def resolve(self, tree: Any) -> Any:
        return tree


def deferred(part: Later) -> Any:
    """`part` in the open batch, or its value at once (one copy) outside a batch."""
    batch = getattr(_open, "batch", None)
    if batch is not None:
        return batch.add(part)
    return part.finish(to_host(part.words))


def _aligned_words(raw: Any, start: int, stop: int) -> Any:
    """Bytes [start, stop) of the flat byte view `raw` as int32 words, zero-padded to a
    multiple of 4 bytes. A view at a byte offset that is not a multiple of 4 (a bf16 `x[1:]`,
    an FSDP2 gradient inside its reduce-scatter buffer, a bucket view) cannot be viewed as
    int32: only that piece is copied (at most DEVICE_CHUNK words)."""
    import torch

    piece = raw[start:stop]
    pad = (-piece.numel()) % 4
    if pad or piece.storage_offset() % 4:
        piece = torch.cat([piece, piece.new_zeros(pad)]) if pad else piece.clone()
    return piece.view(torch.int32)


def device_digest(flat: Any) -> Fingerprint:
    """Order-sensitive 128-bit digest computed where the tensor lives (integer ops only);
    the two sums cross to the host with the rest of the audit's (`one_transfer`)."""
    return deferred(_digest(flat))


def _digest(flat: Any) -> Later:
    import torch

    raw = flat.reshape(-1).view(torch.uint8)
    nbytes = raw.numel()  # part of the digest: zero padding must not make lengths collide
    first = torch.zeros((), dtype=torch.int64, device=flat.device)
    second = torch.zeros((), dtype=torch.int64, device=flat.device)
    step = 4 * DEVICE_CHUNK
    for offset in range(0, nbytes, step):
        words = _aligned_words(raw, offset, min(offset + step, nbytes))
        start = offset // 4
        chunk = words.to(torch.int64) & 0xFFFFFFFF
        idx = torch.arange(start, start + chunk.numel(), device=flat.device, dtype=torch.int64)
        # Position-dependent odd multipliers make the sum order-sensitive; int64 wraps.
        mixed = (chunk + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
        mixed = mixed ^ (mixed >> 31)
        first += mixed.sum()
        second += (mixed * ((idx << 1) | 1)).sum()

    def finish(words: list[int]) -> str:
        return f"{nbytes:x}-{words[0] & _MASK64:016x}{words[1] & _MASK64:016x}"

    return Later(torch.stack([first, second]), finish)


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


def content_hash(tensor: Any) -> Fingerprint:
    """The exact fingerprint of `tensor`'s contents (this rank's shard of a DTensor): a
    string, or inside `one_transfer` a placeholder for one still on its device."""
    flat = local_shard(tensor).reshape(-1)
    if flat.numel() == 0:
        return hash_bytes(b"")
    if flat.device.type == "meta":
        return NO_DATA
    if flat.device.type != "cpu":
        digest = _digest(flat.contiguous())
        return deferred(Later(digest.words, lambda words: "d" + digest.finish(words)))
    data = cpu_bytes(flat.contiguous())
    if len(data) > HASH_CHUNK:
        return _hash_pieces(data)
    return hash_bytes(data)


def _number(x: float) -> Any:
    # JSON has no NaN/inf: keep them readable as strings.
    return x if math.isfinite(x) else repr(x)


STATS_CHUNK = 1 << 24
"""Elements converted to float32 at a time for the statistics of a tensor whose reductions
cannot accumulate in float32 without a full copy (bf16 on CPU, integers, fp8): bounds the
temporary to 64 MiB instead of 2x (bf16) or 4x (int8) the tensor."""

STATS = ("norm", "mean", "min", "max")
"""The statistics of a tensor, in the order `statistics` returns them."""


def statistics(values: Any) -> Later:
    """norm, mean, min and max of a flat, non-empty tensor in float32 or better, without a
    float32 copy of it: reductions accumulate in float32 inside the kernel where torch does
    so (bf16/fp16 on CUDA, `make_reduction` in aten/src/ATen/native/ReduceOpsUtils.h); else
    the tensor is converted a chunk at a time. The four values cross to the host as float64
    bits with the rest of the audit (`one_transfer`)."""
    import torch

    wide = values.dtype in (torch.float32, torch.float64)
    fused = values.is_cuda and values.dtype in (torch.float16, torch.bfloat16)
    if wide or fused:
        low, high = torch.aminmax(values)
        dtype = None if wide else torch.float32
        norm = torch.linalg.vector_norm(values, dtype=dtype)
        parts = [norm, torch.mean(values, dtype=dtype), low, high]
    else:
        count = values.numel()
        sums, squares, lows, highs = [], [], [], []
        for start in range(0, count, STATS_CHUNK):
            work = values[start : start + STATS_CHUNK].to(torch.float32)
            low, high = torch.aminmax(work)
            squares.append(torch.linalg.vector_norm(work))
            sums.append(work.sum() if count > STATS_CHUNK else work.mean())
            lows.append(low)
            highs.append(high)
        if count <= STATS_CHUNK:  # one chunk: exactly what a float32 copy would give
            parts = [squares[0], sums[0], lows[0], highs[0]]
        else:
            norm = torch.linalg.vector_norm(torch.stack(squares).to(torch.float64))
            mean = torch.stack(sums).to(torch.float64).sum() / count
            parts = [norm, mean, torch.stack(lows).min(), torch.stack(highs).max()]
    bits = torch.stack([p.to(torch.float64) for p in parts]).view(torch.int64)

    def finish(words: list[int]) -> list[float]:
        return list(struct.unpack("<4d", struct.pack("<4q", *words)))

    return Later(bits, finish)


def _number(x: float) -> Any:
    # JSON has no NaN/inf: keep them readable as strings.
    return x if math.isfinite(x) else repr(x)


def absmax(low: float, high: float) -> float:
    """The largest magnitude from the minimum and maximum (NaN if either is)."""
    if math.isnan(low) or math.isnan(high):
        return math.nan
    return max(abs(low), abs(high))


def stat_values(tensor: Any) -> Any:
    """The flat values statistics are taken of (a complex tensor as its real pairs), or None
    when there are none (empty, or a tensor without data)."""
    import torch

    local = local_shard(tensor)
    if local.numel() == 0 or local.device.type == "meta":
        return None
    values = local.reshape(-1)
    if local.is_complex():
        values = torch.view_as_real(values).reshape(-1)
    return values


def describe(tensor: Any) -> dict[str, Any]:
    """dtype, shape, fingerprint and a few readable statistics of a tensor (one copy to the
    host, or none of its own inside `one_transfer`)."""
    import torch

    local = local_shard(tensor)
    with one_transfer() as batch:
        info: dict[str, Any] = {
            "dtype": str(local.dtype).replace("torch.", ""),
            "shape": list(local.shape),
            "hash": content_hash(local),
        }
        values = stat_values(local)
        if values is not None:
            part = statistics(values)

            def readable(words: list[int]) -> dict[str, Any]:
                return {name: _number(x) for name, x in zip(STATS, part.finish(words))}

            info["stats"] = deferred(Later(part.words, readable))
            if values.numel() <= SMALL_TENSOR:
                small = values.to(torch.float64).view(torch.int64)

                def exact(words: list[int]) -> list[Any]:
                    floats = struct.unpack(
                        f"<{len(words)}d", struct.pack(f"<{len(words)}q", *words)
                    )
                    return [_number(v) for v in floats]

                info["values"] = deferred(Later(small, exact))
        return batch.resolve(info)
