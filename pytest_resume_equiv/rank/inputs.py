"""What automatic recording keeps of what the training hands torch (rank/auto.py): a
micro-batch's inputs as an id per sample, and the value of each tensor `backward()` is called
on. Both stay on their device until the step's line is written (a `Later`): no copy to the
host and no sync inside the forward or the backward.

A sample's id hashes its row (dim 0) of every batched input tensor, with the other inputs
whole: ids per sample, not per micro-batch, so the global batch is accounted on any number
of ranks (compare/accounting.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from .fingerprint import Fingerprint, Later, content_hash, hash_bytes, local_shard


def tensors_in(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The tensors in a forward's arguments, with where they were (`0`, `x`, `0.ids`)."""
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors_in(item, f"{path}.{i}" if path else str(i))
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from tensors_in(value[key], f"{path}.{key}" if path else str(key))


def _fingerprint(tensor: Any) -> Fingerprint:
    """The content hash of one tensor, left on its device (a `Later`) until the step's line
    is written: no copy to the host, no sync in the forward."""
    flat = local_shard(tensor)
    if flat.device.type in ("cpu", "meta") or flat.numel() == 0:
        return content_hash(flat)
    from .fingerprint import _digest

    digest = _digest(flat.reshape(-1).contiguous())
    return Later(digest.words, lambda words: "d" + digest.finish(words))


_MASK64 = (1 << 64) - 1
SAMPLE_BITS = 52
"""Bits of a sample's id: exact in any JSON reader (a double holds 53), and far from a
collision among the samples of a run."""


def _row_digests(tensor: Any) -> Any:
    """One 64-bit digest per row (dim 0) of `tensor`: a list of ints on CPU, a `Later` on a
    device (reduced there, integer arithmetic only, no copy of the rows to the host)."""
    import torch

    local = local_shard(tensor).contiguous()
    rows = local.shape[0]
    raw = local.reshape(-1).view(torch.uint8).reshape(rows, -1)
    if local.device.type == "cpu":
        data = raw.numpy()
        return [_hash64(data[i]) for i in range(rows)]
    pad = (-raw.shape[1]) % 4
    if pad:
        raw = torch.nn.functional.pad(raw, (0, pad))
    words = raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    idx = torch.arange(words.shape[1], device=words.device, dtype=torch.int64)
    mixed = (words + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
    mixed = mixed ^ (mixed >> 31)
    first, second = mixed.sum(dim=1), (mixed * ((idx << 1) | 1)).sum(dim=1)

    def finish(found: list[int]) -> list[int]:
        return [
            ((found[i] & _MASK64) * 0x9E3779B97F4A7C15 ^ (found[rows + i] & _MASK64)) & _MASK64
            for i in range(rows)
        ]

    return Later(torch.cat([first, second]), finish)


def _hash64(row: Any) -> int:
    return int(hash_bytes(row)[:16], 16)


def batch_parts(inputs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """What a micro-batch's samples are told by: the tensors whose first dimension is the
    batch's (the first tensor's) by row, every other tensor whole, each named by where it was
    given, its dtype and the shape of a row."""
    tensors = [(w, t) for w, t in inputs if t.dim() >= 1 and t.shape[0] > 0]
    size = tensors[0][1].shape[0] if tensors else None
    parts = []
    for where, tensor in inputs:
        label = f"{where}:{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape[1:])}"
        if size is not None and tensor.dim() >= 1 and tensor.shape[0] == size:
            parts.append((f"rows {label}", _row_digests(tensor)))
        else:
            parts.append((f"whole {label}", _fingerprint(tensor)))
    return parts


def sample_ids(parts: list[tuple[str, Any]]) -> list[int]:
    """Each sample's id in a micro-batch (its parts resolved): its rows of every batched
    tensor and every other tensor whole, hashed together; one id for a batch with no rows."""
    rows = [(where, found) for where, found in parts if where.startswith("rows ")]
    whole = "|".join(f"{where}={found}" for where, found in parts if where.startswith("whole "))
    count = len(rows[0][1]) if rows else 1
    out = []
    for i in range(count):
        text = "|".join(f"{where}={found[i]}" for where, found in rows) + "|" + whole
        out.append(int(hash_bytes(text.encode())[:16], 16) >> (64 - SAMPLE_BITS))
    return out


def loss_value(tensor: Any) -> Any:
    """A backward's tensor as the step keeps it until it is written: detached (a scalar's
    value as float64 bits on its device, read with the step's other device values)."""
    torch = sys.modules["torch"]
    local = local_shard(tensor)
    if local.numel() == 1 and (local.is_floating_point()):
        bits = local.reshape(1).to(torch.float64).view(torch.int64)
        return Later(bits, _float_of_bits)
    return _fingerprint(local)


def _float_of_bits(words: list[int]) -> Any:
    import struct

    from .encode import encode_float

    return encode_float(struct.unpack("<d", struct.pack("<q", words[0]))[0])
