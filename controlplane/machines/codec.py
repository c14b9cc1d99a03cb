"""JSON codec for the machines' frozen dataclass states (``to_json`` / ``load_state``).

Machine states are trees of frozen dataclasses holding strings, numbers, booleans,
timezone-aware datetimes (serialised as ISO 8601 text), ``StrEnum`` members, tuples and
string-keyed dicts. :func:`encode` turns such a tree into JSON; :func:`decode` rebuilds it
from the dataclass field annotations, so a new field needs no hand-written (de)serialiser.
Fields typed :data:`RawJson` are copied through untouched (pod templates, class configs).

Called by every machine module's ``to_json`` and ``load_state``. Pure.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, TypeVar

from controlplane.engine.jsonvalue import JsonObject, JsonValue

#: Marks a field whose value is opaque JSON (copied, never interpreted by the codec).
RawJson = Annotated[JsonObject, "raw-json"]

T = TypeVar("T")


def encode(value: object) -> JsonValue:
    """Encode a state tree as JSON (datetimes as ISO text, enums as their value)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Enum):
        return _enum_value(value)
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime in a machine state; pass timezone-aware UTC")
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot encode {type(value).__name__} in a machine state")


def encode_object(value: object) -> JsonObject:
    """Encode a dataclass as a JSON object."""
    out = encode(value)
    if not isinstance(out, dict):
        raise TypeError(f"{type(value).__name__} does not encode to a JSON object")
    return out


def decode(cls: type[T], data: JsonValue) -> T:
    """Rebuild a dataclass of type ``cls`` from :func:`encode`'s output."""
    result: T = _decode(cls, data)
    return result


def _enum_value(value: Enum) -> JsonValue:
    raw = value.value
    if isinstance(raw, str | int):
        return raw
    raise TypeError(f"enum {type(value).__name__} has a non-JSON value")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # JSON aliases are recursive forward references: resolve them wherever a state lives.
    aliases = {"JsonValue": JsonValue, "JsonObject": JsonObject, "RawJson": RawJson}
    return typing.get_type_hints(cls, localns=aliases, include_extras=True)


def _decode(tp: Any, data: JsonValue) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        if "raw-json" in tp.__metadata__:
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            return dict(data)
        return _decode(typing.get_args(tp)[0], data)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(typing.get_args(tp), data)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise ValueError(f"expected a JSON array for {tp}, got {type(data).__name__}")
        return tuple(_decode(args[0], item) for item in data)
    if origin is dict:
        value_type = typing.get_args(tp)[1]
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object for {tp}, got {type(data).__name__}")
        return {str(k): _decode(value_type, v) for k, v in data.items()}
    if tp is Any:
        return data
    if isinstance(tp, type):
        return _decode_type(tp, data)
    raise TypeError(f"cannot decode type {tp!r}")


def _decode_union(options: tuple[Any, ...], data: JsonValue) -> Any:
    if data is None and type(None) in options:
        return None
    errors: list[str] = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _decode(option, data)
        except (TypeError, ValueError, KeyError) as err:
            errors.append(str(err))
    raise ValueError(f"no union member matched {data!r}: {'; '.join(errors)}")


def _decode_type(tp: type, data: JsonValue) -> Any:
    if issubclass(tp, Enum):
        return tp(data)
    if tp is datetime:
        if not isinstance(data, str):
            raise ValueError(f"expected an ISO datetime string, got {data!r}")
        parsed = datetime.fromisoformat(data)
        if parsed.tzinfo is None:
            raise ValueError(f"datetime {data!r} has no timezone")
        return parsed
    if tp is bool:
        if not isinstance(data, bool):
            raise ValueError(f"expected a boolean, got {data!r}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise ValueError(f"expected an integer, got {data!r}")
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise ValueError(f"expected a number, got {data!r}")
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise ValueError(f"expected a string, got {data!r}")
        return data
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object for {tp.__name__}, got {data!r}")
        hints = _hints(tp)
        kwargs = {f.name: _decode(hints[f.name], data[f.name])
                  for f in dataclasses.fields(tp) if f.name in data}
        return tp(**kwargs)
    raise TypeError(f"cannot decode type {tp.__name__}")
