"""Encoded signature values as people read them: short text for reports, numbers for plots.

Floats are decoded from their exact bits (`rank.encode.decode_float`), never from the
readable `repr` stored beside them.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .rank.encode import decode_float
from .rank.layout import FLOAT_TAG, TENSOR_TAG

MAX_VALUE_CHARS = 160


def readable(value: Any) -> str:
    """A short human form of an encoded value."""
    text = _readable(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _readable(value: Any) -> str:
    if isinstance(value, dict):
        if FLOAT_TAG in value:
            return repr(decode_float(value))
        if TENSOR_TAG in value:
            return _readable_tensor(value[TENSOR_TAG])
        return "{" + ", ".join(f"{k!r}: {_readable(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_readable(v) for v in value) + "]"
    return json.dumps(value)


def _readable_tensor(t: dict) -> str:
    shape = "x".join(map(str, t.get("shape", []))) or "scalar"
    parts = [f"{t.get('dtype')}[{shape}]"]
    if "values" in t and len(t["values"]) <= 4:
        parts.append("values=" + ", ".join(_number(v) for v in t["values"]))
    else:
        parts += [f"{k}={_number(v)}" for k, v in t.get("stats", {}).items()]
    parts.append(f"hash={str(t.get('hash'))[:12]}")
    return "tensor(" + " ".join(parts) + ")"


def _number(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def scalar(value: Any) -> Optional[float]:
    """The number an encoded value stands for, if it is one (exact floats come back exactly)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return decode_float(value)


def count(n: int, noun: str) -> str:
    """ "1 rank", "2 ranks"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
