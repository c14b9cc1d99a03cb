"""JSON codec for the machines' frozen dataclass states (``to_json`` / ``load_state``).

Machine states are trees of frozen dataclasses holding strings, numbers, booleans,
timezone-aware datetimes (serialised as ISO 8601 text), ``StrEnum`` members, tuples and
string-keyed dicts. :func:`encode` turns such a tree into JSON; :func:`decode` rebuilds it
from the dataclass field annotations, so a new field needs no hand-written (de)serialiser.
Fields typed :data:`RawJson` are copied through untouched (pod templates, class configs).

Called by every machine module's ``to_json`` and ``load_state`` (through
``machines.base.codec``) and by the typed events and commands (:mod:`controlplane.engine.events`,
:mod:`controlplane.engine.commands`), which is why it lives in the engine. Pure.
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

import orjson

from controlplane.engine.jsonvalue import JsonObject, JsonValue

#: Marks a field whose value is opaque JSON (copied, never interpreted by the codec).
RawJson = Annotated[JsonObject, "raw-json"]

T = TypeVar("T")


def encode(value: object) -> JsonValue:
    """Encode a state tree as JSON (datetimes as ISO text, enums as their value).

    Every ``to_json`` (each transition's projection, each replayed machine) runs this
    over the whole state, pod template included, so orjson walks the tree in C (it
    serialises dataclasses field by field, enums by value, tuples as arrays) and the
    text is parsed back into Python values: about half the time of a walk in Python
    (60 -> 33 us for a migration's state, ``docs/performance.md``). Datetimes come back
    to :func:`_encode_other`, which refuses a naive one. orjson leaves out dataclass
    fields named with a leading underscore; no state has one (a test checks).
    """
    try:
        encoded: JsonValue = orjson.loads(orjson.dumps(value, default=_encode_other,
                                                       option=_OPTIONS))
    except orjson.JSONEncodeError as err:
        cause = err.__cause__
        if isinstance(cause, TypeError | ValueError):  # ours, from _encode_other
            raise cause from None
        raise TypeError(f"cannot encode {type(value).__name__} in a machine state: {err}"
                        ) from None
    return encoded


# Datetimes go to ``default`` (to refuse naive ones); dict keys are written as strings.
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


def _encode_other(value: Any) -> JsonValue:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime in a machine state; pass timezone-aware UTC")
        text: str = value.isoformat()
        return text
    raise TypeError(f"cannot encode {type(value).__name__} in a machine state")


#: Field metadata of a field added to a state after histories were recorded without it:
#: :func:`encode_object` leaves it out while it holds its default, so a history written
#: before the field existed still folds to exactly the projection it wrote (the golden
#: rows pin that), and decoding a projection without the key gives the default back.
OMIT_DEFAULT: dict[str, object] = {"omit_default": True}


def encode_object(value: object) -> JsonObject:
    """Encode a dataclass as a JSON object (fields marked :data:`OMIT_DEFAULT` left out
    while they hold their default)."""
    out = encode(value)
    if not isinstance(out, dict):
        raise TypeError(f"{type(value).__name__} does not encode to a JSON object")
    _omit_defaults(value, out)
    return out


def _omit_defaults(value: object, out: JsonObject) -> None:
    for name, default, nested in _omissions(type(value)):
        held = getattr(value, name)
        inner = out.get(name)
        if nested == _SEQUENCE:
            if isinstance(held, tuple) and isinstance(inner, list):
                for item, encoded in zip(held, inner, strict=True):
                    if isinstance(encoded, dict):
                        _omit_defaults(item, encoded)
        elif nested:
            if held is not None and isinstance(inner, dict):
                _omit_defaults(held, inner)
        elif held == default:
            out.pop(name, None)


_OMISSIONS: dict[type, tuple[tuple[str, object, bool | str], ...]] = {}
_SEQUENCE = "sequence"  # a tuple of dataclasses with marked fields


def _omissions(cls: type) -> tuple[tuple[str, object, bool | str], ...]:
    """(field, default, nested?) for the fields of ``cls`` that are marked, or that hold a
    dataclass (or a tuple of them) which has marked fields somewhere below it (worked out
    once per class)."""
    known = _OMISSIONS.get(cls)
    if known is None:
        _OMISSIONS[cls] = ()  # a type that contains itself further down ends here
        known = _OMISSIONS[cls] = _plan_omissions(cls)
    return known


def _plan_omissions(cls: type) -> tuple[tuple[str, object, bool | str], ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    plan: list[tuple[str, object, bool | str]] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("omit_default"):
            plan.append((f.name, f.default, False))
            continue
        for member in _members(hints[f.name]):
            items = typing.get_args(member) if typing.get_origin(member) is tuple else ()
            if len(items) == 2 and items[1] is Ellipsis and isinstance(items[0], type) and \
                    dataclasses.is_dataclass(items[0]) and _omissions(items[0]):
                plan.append((f.name, None, _SEQUENCE))
                break
            if isinstance(member, type) and dataclasses.is_dataclass(member) and \
                    _omissions(member):
                plan.append((f.name, None, True))
                break
    return tuple(plan)


def _members(tp: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(tp)
    return (tp,)


def decode(cls: type[T], data: JsonValue) -> T:
    """Rebuild a dataclass of type ``cls`` from :func:`encode`'s output.

    Strict: a key no dataclass field declares raises :class:`UnknownField`, an enum value
    the enum lacks ``ValueError``, so what a newer release wrote is never half read."""
    result: T = _decode(cls, data)
    return result


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # JSON aliases are recursive forward references: resolve them wherever a state lives.
    aliases = {"JsonValue": JsonValue, "JsonObject": JsonObject, "RawJson": RawJson}
    return typing.get_type_hints(cls, localns=aliases, include_extras=True)


Decoder = Callable[[JsonValue], Any]


def _decode(tp: Any, data: JsonValue) -> Any:
    return _decoder(tp)(data)


@functools.cache
def _decoder(tp: Any) -> Decoder:
    """The decoder of one type, built once: ``load_state`` runs on every lease, so the type
    is not re-inspected per value. A type the codec cannot read gets a decoder that raises
    ``TypeError`` when called (a union skips such a member, as it skips a mismatch).
    """
    origin = typing.get_origin(tp)
    if origin is Annotated:
        if "raw-json" in tp.__metadata__:
            return _decode_raw_json
        return _decoder(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union_decoder(typing.get_args(tp))
    if origin is tuple:
        return _tuple_decoder(tp)
    if origin is dict:
        return _dict_decoder(tp)
    if tp is Any:
        return _identity
    if isinstance(tp, type):
        return _type_decoder(tp)
    return _refuse(f"cannot decode type {tp!r}")


def _refuse(message: str) -> Decoder:
    def refuse(data: JsonValue) -> Any:
        raise TypeError(message)

    return refuse


def _identity(data: JsonValue) -> Any:
    return data


def _decode_raw_json(data: JsonValue) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return dict(data)


def _union_decoder(options: tuple[Any, ...]) -> Decoder:
    nullable = type(None) in options
    members = [(option, _decoder(option)) for option in options if option is not type(None)]

    def decode_union(data: JsonValue) -> Any:
        if data is None and nullable:
            return None
        errors: list[str] = []
        for _option, member in members:
            try:
                return member(data)
            except (TypeError, ValueError, KeyError) as err:
                errors.append(str(err))
        raise ValueError(f"no union member matched {data!r}: {'; '.join(errors)}")

    return decode_union


def _tuple_decoder(tp: Any) -> Decoder:
    item = _decoder(typing.get_args(tp)[0])

    def decode_tuple(data: JsonValue) -> Any:
        if not isinstance(data, list):
            raise ValueError(f"expected a JSON array for {tp}, got {type(data).__name__}")
        return tuple([item(value) for value in data])

    return decode_tuple


def _dict_decoder(tp: Any) -> Decoder:
    value = _decoder(typing.get_args(tp)[1])

    def decode_dict(data: JsonValue) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object for {tp}, got {type(data).__name__}")
        return {str(k): value(v) for k, v in data.items()}

    return decode_dict


def _type_decoder(tp: type) -> Decoder:
    if issubclass(tp, Enum):
        return tp
    if tp is datetime:
        return _decode_datetime
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        return scalar
    if dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    return _refuse(f"cannot decode type {tp.__name__}")


class UnknownField(ValueError):
    """A JSON object with a key its dataclass does not declare: written by a newer release
    (or for another type). Refused rather than dropped: dropping it would be a guess about
    what the writer meant, and re-encoding would lose it (``worker.readable``)."""


def _dataclass_decoder(tp: type) -> Decoder:
    names = tuple(f.name for f in dataclasses.fields(tp))
    known = frozenset(names)
    fields: list[tuple[str, Decoder]] = []  # filled on first use: states nest recursively

    def decode_dataclass(data: JsonValue) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object for {tp.__name__}, got {data!r}")
        if not known.issuperset(data):
            raise UnknownField(f"{tp.__name__} has no field {sorted(set(data) - known)}")
        if not fields:
            hints = _hints(tp)
            fields.extend((name, _decoder(hints[name])) for name in names)
        return tp(**{name: field(data[name]) for name, field in fields if name in data})

    return decode_dataclass


def field_decoders(cls: type) -> dict[str, Decoder]:
    """Field name -> its decoder, for a caller that decodes a dataclass's fields itself
    (the typed events: they check their keys and skip absent optional fields)."""
    hints = _hints(cls)
    return {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls)}


def _decode_datetime(data: JsonValue) -> datetime:
    if not isinstance(data, str):
        raise ValueError(f"expected an ISO datetime string, got {data!r}")
    parsed = datetime.fromisoformat(data)
    if parsed.tzinfo is None:
        raise ValueError(f"datetime {data!r} has no timezone")
    return parsed


def _decode_bool(data: JsonValue) -> bool:
    if not isinstance(data, bool):
        raise ValueError(f"expected a boolean, got {data!r}")
    return data


def _decode_int(data: JsonValue) -> int:
    if isinstance(data, bool) or not isinstance(data, int):
        raise ValueError(f"expected an integer, got {data!r}")
    return data


def _decode_float(data: JsonValue) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise ValueError(f"expected a number, got {data!r}")
    return float(data)


def _decode_str(data: JsonValue) -> str:
    if not isinstance(data, str):
        raise ValueError(f"expected a string, got {data!r}")
    return data


_SCALARS: dict[type, Decoder] = {bool: _decode_bool, int: _decode_int, float: _decode_float,
                                 str: _decode_str}
