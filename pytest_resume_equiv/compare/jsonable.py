"""Records that travel as JSON only between processes of one session (facts, comparisons,
verdicts, run and test records), written and read back from their dataclass fields.

A pytest-xdist worker sends its test records to the controller as JSON, and the JSON report
is the same JSON, so each record's JSON must read back as the record it was. One helper does
it from the field types (nested dataclasses, Optional, list, tuple, dict, enums, and a
`Fact` by its registered kind), instead of a hand-written pair per class that drifts from
its fields. Where the JSON differs from the fields, the class says so:

- `field(metadata=json_key("likely_cause"))`: the field's JSON key, where it is not its name;
- `field(metadata=NOT_IN_JSON)`: in memory only (it must have a default);
- `json_extra(self) -> dict`: keys computed for the JSON's readers (text, totals); written,
  never read back; a key named like a field replaces that field's JSON;
- `json_in(cls, data) -> dict` (classmethod): the JSON as the fields read it, where a field
  was written under other keys by `json_extra`.

Keys the fields do not name are ignored when reading, and a missing key takes the field's
default. The versioned files on disk (signatures, goldens, the judgement file, shared
launches, the launch context) keep their explicit code: their format is a promise to other
versions, not a mirror of today's fields.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from . import facts
from .facts import Fact

JSON_KEY = "json"
"""The field metadata entry naming the field's JSON key (None: not in the JSON)."""
NOT_IN_JSON: Mapping[str, Any] = {JSON_KEY: None}

Json = Union[None, bool, int, float, str, list, dict]
T = TypeVar("T")


def json_key(name: str) -> Mapping[str, Any]:
    """Field metadata: the field's JSON key is `name`."""
    return {JSON_KEY: name}


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, str, Any], ...]:
    """(field, JSON key, resolved type) of every field `cls` writes."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (f, f.metadata.get(JSON_KEY, f.name), hints[f.name])
        for f in dataclasses.fields(cls)
        if f.init and f.metadata.get(JSON_KEY, f.name) is not None
    )


def to_json(record: Any) -> dict[str, Json]:
    """A dataclass record as a JSON object of its fields (a registered fact with its `kind`
    first, then its `json_extra` keys)."""
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"{type(record).__name__} is not a dataclass record: {record!r:.80}")
    cls = type(record)
    data: dict[str, Json] = {}
    kind = facts.kind_of(cls)
    if kind is not None:
        data["kind"] = kind
    for f, name, _ in _fields(cls):
        data[name] = _write(getattr(record, f.name))
    extra = getattr(record, "json_extra", None)
    if extra is not None:
        data.update({k: _write(v) for k, v in extra().items()})
    return data


def _write(value: Any) -> Json:
    """Any value of a record as JSON data: tuples as lists, dict keys as strings, enums as
    their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, enum.Enum):
        return _write(value.value)
    if isinstance(value, (list, tuple)):
        return [_write(v) for v in value]
    if isinstance(value, Mapping):
        return {_key_text(k): _write(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} has no JSON form: {value!r:.80}")


def _key_text(k: Any) -> str:
    if isinstance(k, enum.Enum):
        k = k.value
    if isinstance(k, (str, int)) and not isinstance(k, bool):
        return str(k)
    raise TypeError(f"a JSON object key must be a string or an int, not {k!r}")


def from_json(cls: type[T], data: Any, where: str = "record") -> T:
    """The `cls` that `to_json` wrote as `data`; ValueError says where it does not fit
    (`where` names the whole, e.g. the file or the worker it came from)."""
    return _read(cls, data, where)


def _read(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    if tp is Fact:
        return _read_fact(data, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        if data is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"{where}: only Optional[X] unions are read from JSON, not {tp}")
        return _read(kinds[0], data, where)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(data, list):
            raise _mismatch(where, "a list", data)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(data):
                raise ValueError(f"{where}: expected {len(args)} items, got {len(data)}")
            return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
        item = args[0] if args else Any
        items = [_read(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise _mismatch(where, "an object", data)
        k_tp, v_tp = args or (Any, Any)
        return {
            _read_key(k_tp, k, where): _read(v_tp, v, f"{where}[{k!r}]") for k, v in data.items()
        }
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, data, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise ValueError(f"{where}: {data!r} is not a {tp.__name__}") from None
    return _read_scalar(tp, data, where)


def _read_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise _mismatch(where, f"a {cls.__name__} object", data)
    hook = getattr(cls, "json_in", None)
    if hook is not None:
        data = hook(data)
    given = {}
    for f, name, tp in _fields(cls):
        if name in data:
            given[f.name] = _read(tp, data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: no {name!r} (a {cls.__name__} needs it)")
    return cls(**given)


def _read_fact(data: Any, where: str) -> Fact:
    if not isinstance(data, dict):
        raise _mismatch(where, "a fact object", data)
    cls = facts.fact_class(data.get("kind"))
    if cls is None:
        raise ValueError(f"{where}: unknown kind of fact {data.get('kind')!r}")
    return _read_dataclass(cls, data, where)


def _read_key(tp: Any, k: str, where: str) -> Any:
    """A JSON object's key as the dict's key type (JSON writes every key as a string)."""
    if tp is int:
        try:
            return int(k)
        except ValueError:
            raise ValueError(f"{where}: key {k!r} is not an integer") from None
    return _read(tp, k, f"{where} key")


_SCALARS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _read_scalar(tp: Any, data: Any, where: str) -> Any:
    if tp not in _SCALARS:
        raise TypeError(f"{where}: {tp} cannot be read from JSON")
    if isinstance(data, bool) and tp is not bool:
        raise _mismatch(where, _SCALARS[tp], data)
    if tp is float and isinstance(data, (int, float)):
        return float(data)
    if not isinstance(data, tp):
        raise _mismatch(where, _SCALARS[tp], data)
    return data


def _mismatch(where: str, expected: str, data: Any) -> ValueError:
    return ValueError(f"{where}: expected {expected}, got {type(data).__name__} {data!r:.80}")
