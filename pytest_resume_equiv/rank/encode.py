"""Turn the values a trainer records into exact JSON.

Floats keep every bit (their IEEE-754 bits in hex, beside a readable repr), tensors become
dtype + shape + fingerprint + statistics. Anything else is refused with a message that says
what can be recorded, because a silently lossy signature would hide resume bugs.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Optional

from .fingerprint import (
    Later,
    absmax,
    content_hash,
    deferred,
    describe,
    local_shard,
    one_transfer,
    stat_values,
    statistics,
)
from .layout import FLOAT_TAG, TENSOR_TAG

RECORDABLE = (
    "floats, ints, bools, strings, None, lists/tuples and dicts (string keys) of them, "
    "torch tensors and numpy arrays/scalars"
)


class UnrecordableValue(TypeError):
    pass


def float_bits(x: float) -> str:
    return struct.pack(">d", x).hex()


def encode_float(x: float) -> dict[str, str]:
    return {FLOAT_TAG: float_bits(x), "repr": repr(x) if math.isfinite(x) else str(x)}


def decode_float(value: Any) -> Optional[float]:
    """The exact float an encoded value stands for; None when it is not an encoded float
    (NaN when its bits are damaged: a value, not a crash, for a report)."""
    if not isinstance(value, dict) or FLOAT_TAG not in value:
        return None
    try:
        return struct.unpack(">d", bytes.fromhex(value[FLOAT_TAG]))[0]
    except (TypeError, ValueError, struct.error):
        return math.nan


def encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return encode_float(float(value))
    if isinstance(value, (list, tuple)):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise UnrecordableValue(
                    f"{where} has a key {key!r} of type {type(key).__name__}; "
                    "record() stores dicts with string keys only"
                )
            if key.startswith("$"):
                raise UnrecordableValue(
                    f"{where} has a key {key!r}; keys starting with '$' are reserved"
                )
            out[key] = encode(item, f"{where}[{key!r}]")
        return out
    module = type(value).__module__.split(".")[0]
    if module == "torch" and hasattr(value, "dtype") and hasattr(value, "shape"):
        return {TENSOR_TAG: describe(value)}
    if module == "numpy":
        if getattr(value, "shape", None) == () and hasattr(value, "item"):
            return encode(value.item(), where)
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            import torch

            return {TENSOR_TAG: describe(torch.as_tensor(value))}
    raise UnrecordableValue(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which record() "
        f"cannot store exactly; record {RECORDABLE} (e.g. loss.item() or the tensor itself)"
    )


def state_fingerprint(value: Any) -> Any:
    """A state dict as the audit keeps it: tensors by content hash, the rest encoded (or its
    repr when it cannot be), nesting kept so a difference is named by its path."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return tensor_fingerprint(value)
    if isinstance(value, dict):
        return {str(k): state_fingerprint(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [state_fingerprint(v) for v in value]
    try:
        return encode(value, "state")
    except TypeError:
        return repr(value)


def tensor_fingerprint(tensor: Any) -> Any:
    """A floating tensor as the audit keeps it: its exact hash and, where a tolerance or a
    measured noise applies, its norm, mean and largest magnitude (float32 or better, without
    a float32 copy of the tensor); any other tensor (counts, generator states) by its hash
    alone. Inside `one_transfer` the device parts wait for the audit's one copy."""
    local = local_shard(tensor)
    if not (local.is_floating_point() or local.is_complex()):
        return content_hash(local)
    with one_transfer() as batch:
        found: dict[str, Any] = {"hash": content_hash(local)}
        values = stat_values(local)
        if values is not None:
            part = statistics(values)
            for name, pick in (("norm", _norm), ("mean", _mean), ("absmax", _absmax)):
                found[name] = deferred(Later(part.words, _encoded(part, pick)))
        return batch.resolve(found)


def _norm(stats: list[float]) -> float:
    return stats[0]


def _mean(stats: list[float]) -> float:
    return stats[1]


def _absmax(stats: list[float]) -> float:
    return absmax(stats[2], stats[3])


def _encoded(part: Later, pick: Callable[[list[float]], float]) -> Callable[[list[int]], Any]:
    return lambda words: encode_float(pick(part.finish(words)))
