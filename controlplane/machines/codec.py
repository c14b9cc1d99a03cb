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
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, TypeVar

from controlplane.engine.jsonvalue import JsonObject, JsonValue

#: Marks a field whose value is opaque JSON (copied, never interpreted by the codec).
RawJson = Annotated[JsonObject, "raw-json"]

T = TypeVar("T")


def encode(value: object) -> JsonValue:
    """Encode a state tree as JSON (datetimes as ISO text, enums as their value).

    Every ``to_json`` (each transition's projection, each replayed machine) runs this
    over the whole state, pod template included, so it dispatches on the exact type
    through a per-type table (dataclass field names are read once per class) instead of
    a chain of ``isinstance`` and ``dataclasses.fields`` calls per value.
    """
    kind = type(value)
    if kind in _PLAIN:
        return value  # type: ignore[return-value]
    encoder = _ENCODERS.get(kind)
    if encoder is None:
        encoder = _ENCODERS[kind] = _encoder_for(kind)
    return encoder(value)


_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_ENCODERS: dict[type, Callable[[Any], JsonValue]] = {}


def _encode_list(value: Any) -> JsonValue:
    return [item if type(item) in _PLAIN else encode(item) for item in value]


def _encode_dict(value: Any) -> JsonValue:
    return {str(k): v if type(v) in _PLAIN else encode(v) for k, v in value.items()}


def _encode_datetime(value: Any) -> JsonValue:
    if value.tzinfo is None:
        raise ValueError("naive datetime in a machine state; pass timezone-aware UTC")
    text: str = value.isoformat()
    return text


def _encoder_for(kind: type) -> Callable[[Any], JsonValue]:
    # Same precedence as a chain of isinstance checks: JSON scalars (and their
    # subclasses that are not enums), enums, datetimes, sequences, dicts, dataclasses.
    if issubclass(kind, Enum):
        return _enum_value
    if issubclass(kind, bool | int | float | str):
        return lambda value: value
    if issubclass(kind, datetime):
        return _encode_datetime
    if issubclass(kind, tuple | list):
        return _encode_list
    if issubclass(kind, dict):
        return _encode_dict
    if dataclasses.is_dataclass(kind):
        names = tuple(f.name for f in dataclasses.fields(kind))

        def encode_dataclass(value: Any) -> JsonValue:
            out: JsonObject = {}
            for name in names:
                item = getattr(value, name)
                out[name] = item if type(item) in _PLAIN else encode(item)
            return out

        return encode_dataclass
    raise TypeError(f"cannot encode {kind.__name__} in a machine state")


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
