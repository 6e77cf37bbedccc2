"""What a micro-batch's samples are told by, for automatic recording (rank/auto.py): each
sample's id from its content (its rows of every batched tensor, the items of a sample list,
every other tensor whole), reduced where the batch lives, with no copy of the batch to the
host (benchmarks/bench_input_fingerprint.py)."""

from __future__ import annotations

from typing import Any

from .fingerprint import Fingerprint, Later, content_hash, cpu_bytes, hash_bytes, local_shard
from .loaded import SampleList, batch_tensors


def tensor_fingerprint(tensor: Any) -> Fingerprint:
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


BAND_WORDS = 1 << 22
"""Elements of each int64 temporary of the device input fingerprint (32 MiB): its peak
memory, whatever the batch's size."""


def _row_digests(tensor: Any) -> Any:
    """One 64-bit digest per row (dim 0) of `tensor`: a list of ints on CPU, a `Later` on a
    device (reduced there, integer arithmetic only, no copy of the rows to the host)."""
    import torch

    local = local_shard(tensor).contiguous()
    rows = local.shape[0]
    raw = local.reshape(-1).view(torch.uint8).reshape(rows, -1)
    if local.device.type == "cpu":
        # a numpy array or bytes (no numpy): each row is a slice of one buffer, no copy
        data = memoryview(cpu_bytes(raw.reshape(-1)))
        width = raw.shape[1]
        return [_hash64(data[i * width : (i + 1) * width]) for i in range(rows)]
    return device_row_digests(raw)


def device_row_digests(raw: Any) -> Later:
    """`_row_digests` where the rows live: the bytes of each row (`raw`, uint8, rows x
    bytes) as int32 words, mixed by position and summed per row, a band of columns at a time
    so that the int64 temporaries stay under `BAND_WORDS` elements whatever the batch's
    size (a 1 GiB video batch would otherwise take several GiB more of device memory for
    its fingerprint). The two sums per row are all that reaches the host, with the rest of
    the step's line (benchmarks/bench_input_fingerprint.py)."""
    import torch

    rows, width = raw.shape
    words_per_row = -(-width // 4)
    band = max(1, BAND_WORDS // max(rows, 1))
    first = torch.zeros(rows, dtype=torch.int64, device=raw.device)
    second = torch.zeros(rows, dtype=torch.int64, device=raw.device)
    for start in range(0, words_per_row, band):
        stop = min(start + band, words_per_row)
        piece = raw[:, 4 * start : min(4 * stop, width)]
        pad = 4 * (stop - start) - piece.shape[1]
        piece = torch.nn.functional.pad(piece, (0, pad)) if pad else piece.contiguous()
        words = piece.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        idx = torch.arange(start, stop, device=raw.device, dtype=torch.int64)
        mixed = (words + 0x9E3779B1) * ((idx * 0x632BE5AB + 0x7F4A7C15) | 1)
        mixed = mixed ^ (mixed >> 31)
        first += mixed.sum(dim=1)
        second += (mixed * ((idx << 1) | 1)).sum(dim=1)

    def finish(found: list[int]) -> list[int]:
        return [
            ((found[i] & _MASK64) * 0x9E3779B97F4A7C15 ^ (found[rows + i] & _MASK64)) & _MASK64
            for i in range(rows)
        ]

    return Later(torch.cat([first, second]), finish)


def _hash64(row: Any) -> int:
    return int(hash_bytes(row)[:16], 16)


def batch_parts(inputs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """What a micro-batch's samples are told by: its sample lists item by item (one sample
    each) and the tensors whose first dimension is the batch's by row (the batch's size: the
    first sample list's length, else the first tensor's rows), every other tensor or list
    whole; each named by where it was given, its dtype and the shape of a row."""
    lists = [value for _, value in inputs if isinstance(value, SampleList)]
    tensors = [t for _, t in inputs if not isinstance(t, SampleList) and t.dim() >= 1]
    tensors = [t for t in tensors if t.shape[0] > 0]
    size = len(lists[0]) if lists else (tensors[0].shape[0] if tensors else None)
    parts = []
    for where, value in inputs:
        if isinstance(value, SampleList):
            # an item's shape is part of what it is: the same values in another shape differ
            items = [(f"{t.dtype}{list(t.shape)}", tensor_fingerprint(t)) for t in value]
            kind = "rows" if len(items) == size else "whole"
            parts.append((f"{kind} {where}:list", items))
            continue
        label = f"{where}:{str(value.dtype).replace('torch.', '')}{list(value.shape[1:])}"
        if size is not None and value.dim() >= 1 and value.shape[0] == size:
            parts.append((f"rows {label}", _row_digests(value)))
        else:
            parts.append((f"whole {label}", tensor_fingerprint(value)))
    return parts


def forward_inputs(args: Any, kwargs: Any) -> list[tuple[str, Any]]:
    """A forward's tensors: each positional argument (a list of tensors there is a sample
    per item) and the keyword arguments, by where they were given."""
    positional = [t for i, a in enumerate(args) for t in batch_tensors(a, str(i), dict, True)]
    return [*positional, *batch_tensors(kwargs, "kw", dict)]


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


def scalar_value(tensor: Any) -> Any:
    """A backward's tensor as the step keeps it until it is written: detached (a scalar's
    value as float64 bits on its device, read with the step's other device values)."""
    import torch

    local = local_shard(tensor)
    if local.numel() == 1 and (local.is_floating_point()):
        bits = local.reshape(1).to(torch.float64).view(torch.int64)
        return Later(bits, _float_of_bits)
    return tensor_fingerprint(local)


def _float_of_bits(words: list[int]) -> Any:
    import struct

    from .encode import encode_float

    return encode_float(struct.unpack("<d", struct.pack("<q", words[0]))[0])
