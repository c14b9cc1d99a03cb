"""Typed events: one frozen dataclass per event type, the set of them a kind folds, and
the engine's own events.

The store keeps an event as ``(type, data)`` JSON (the engine's :class:`Event`); the
machines and the engine work with typed values instead, so a renamed or misspelt event is
a type error, not an ``evolve`` that silently returns the state unchanged.

- :class:`DomainEvent` is the base of every event class. Its wire name is the class name
  unless the class says otherwise (``class MigrationCancelRequested(DomainEvent,
  name="CancelRequested")``): several kinds record a ``CancelRequested`` with data of
  their own. ``event.recorded(facts)`` is the engine's :class:`Event` for it.
- The wire format is the one histories were recorded in: fields are encoded by
  :mod:`~controlplane.engine.codec` (datetimes as ISO text, enums by value, tuples as
  arrays), in field order, and a field whose default is ``None`` is left out while it is
  ``None`` (an optional key is absent, not ``null``). A field that was always written,
  even as ``null``, is declared without a default.
- :class:`EventSet` is the catalogue one kind folds: ``decode`` turns a recorded event
  into its class and raises :class:`UnknownEvent` for a type the kind does not know, or
  data with a key its class does not declare (re-encoding would drop it).

The engine's own events are defined here, since the store and the worker append them:
``Submitted`` (seq 1), ``Queued`` and ``Admitted`` (admission), ``ActionFailed`` and
``WakeRequested``. Every kind's set includes all but ``Submitted`` (:data:`ENGINE_EVENTS`):
a machine starts from ``initial_state(spec)``, so ``Submitted`` is never folded. The
typed commands (:mod:`controlplane.engine.commands`) share the encoding. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from controlplane.engine.codec import RawJson, encode, encode_object, field_decoders
from controlplane.engine.decider import Event, EventLike
from controlplane.engine.jsonvalue import JsonObject, JsonValue


class UnknownEvent(ValueError):
    """A recorded event this kind cannot read: an unknown type, or data it would lose."""


class DomainEvent:
    """Base of the typed events. Subclasses are frozen dataclasses."""

    NAME: ClassVar[str]

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.NAME = name or cls.__name__

    def data(self) -> JsonObject:
        """The event's data as recorded: see the module docstring for the format."""
        return encode_fields(self)

    def recorded(self, facts: JsonObject | None = None) -> Event:
        """The engine's event for this one, with the facts that justified it."""
        return Event(self.NAME, self.data(), dict(facts or {}))


# --- the wire format of a typed value (events here, commands in engine.commands) ----------

_ENCODERS: dict[type, Callable[[Any], JsonObject]] = {}
_DECODERS: dict[type, dict[str, Callable[[Any], Any]]] = {}


def encode_fields(value: Any) -> JsonObject:
    """The recorded data of a typed event or command (a frozen dataclass)."""
    return _encoder(type(value))(value)


def _encoder(cls: type) -> Callable[[Any], JsonObject]:
    known = _ENCODERS.get(cls)
    if known is not None:
        return known
    fields = dataclasses.fields(cls)
    optional = frozenset(f.name for f in fields if f.default is None)

    def encode_value(typed_value: Any) -> JsonObject:
        out: JsonObject = {}
        for f in fields:
            value = getattr(typed_value, f.name)
            if value is None and f.name in optional:
                continue
            if isinstance(value, str | bool | int):
                out[f.name] = value
            elif dataclasses.is_dataclass(value):
                out[f.name] = encode_object(value)  # fields marked OMIT_DEFAULT left out
            else:
                out[f.name] = encode(value)
        return out

    _ENCODERS[cls] = encode_value
    return encode_value


@dataclass(frozen=True)
class _Shape:
    required: frozenset[str]
    defaults: dict[str, Any]


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type) -> _Shape:
    known = _SHAPES.get(cls)
    if known is None:
        fields = dataclasses.fields(cls)
        for f in fields:
            if f.default_factory is not dataclasses.MISSING:
                raise TypeError(f"{cls.__qualname__}.{f.name}: events and commands take "
                                "plain defaults")
        known = _SHAPES[cls] = _Shape(
            required=frozenset(f.name for f in fields if f.default is dataclasses.MISSING),
            defaults={f.name: f.default for f in fields
                      if f.default is not dataclasses.MISSING})
    return known


def _decoders(cls: type) -> dict[str, Callable[[Any], Any]]:
    known = _DECODERS.get(cls)
    if known is None:
        known = _DECODERS[cls] = field_decoders(cls)
    return known


class Undecodable(ValueError):
    """Recorded data that does not fit its class; the message says how (the caller
    names what it was decoding)."""


def decode_fields(cls: type, data: Mapping[str, JsonValue]) -> Any:
    """The instance of ``cls`` (a frozen dataclass) that ``data`` records, or
    :class:`Undecodable` for a key the class does not declare, a missing one or a value
    that does not decode."""
    decoders = _decoders(cls)
    try:
        fields = {name: decoders[name](value) for name, value in data.items()}
    except KeyError:
        extra = data.keys() - decoders.keys()
        raise Undecodable(f"has data this build does not know: "
                          f"{', '.join(sorted(extra))}") from None
    except (TypeError, ValueError) as err:
        raise Undecodable(f"does not decode: {err}") from err
    shape = _shape(cls)
    if not shape.required.issubset(fields):
        missing = ", ".join(sorted(shape.required - fields.keys()))
        raise Undecodable(f"does not decode: missing {missing}")
    # The fold's inner loop: fill the frozen instance directly (as base.frozen does for
    # states) instead of running the dataclass __init__, which sets field by field.
    typed_value: Any = object.__new__(cls)
    typed_value.__dict__.update(shape.defaults)
    typed_value.__dict__.update(fields)
    return typed_value


class EventSet:
    """The event classes one kind folds, by wire name."""

    def __init__(self, *groups: Iterable[type[DomainEvent]]) -> None:
        self._by_name: dict[str, type[DomainEvent]] = {}
        for group in groups:
            for cls in group:
                known = self._by_name.get(cls.NAME)
                if known is not None and known is not cls:
                    raise ValueError(f"event {cls.NAME!r} is both {known.__qualname__} and "
                                     f"{cls.__qualname__} in one event set")
                self._by_name[cls.NAME] = cls

    def __iter__(self) -> Any:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._by_name)

    def decode(self, event: EventLike | DomainEvent) -> DomainEvent:
        """The typed event of a recorded one (a typed one passes through)."""
        if isinstance(event, DomainEvent):
            return event
        cls = self._by_name.get(event.type)
        if cls is None:
            raise UnknownEvent(f"event type {event.type!r} is not one this kind records "
                               f"(known: {', '.join(sorted(self._by_name))})")
        try:
            typed_event: DomainEvent = decode_fields(cls, event.data)
        except Undecodable as err:
            raise UnknownEvent(f"event {event.type!r} {err}") from err.__cause__
        return typed_event


# --- the engine's own events ------------------------------------------------------------


@dataclass(frozen=True)
class Submitted(DomainEvent):
    """Seq 1 of every machine, appended by the store when it is created. Replay starts
    from ``initial_state(machine_id, spec)`` and folds the events after it."""

    kind: str
    spec: RawJson


@dataclass(frozen=True)
class Queued(DomainEvent):
    """A limit held the new machine back (appended by the store at submission)."""

    reason: str


@dataclass(frozen=True)
class Admitted(DomainEvent):
    """The admitter let a held machine in."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class ActionFailed(DomainEvent):
    """The worker gave up on an action (a terminal error, or retries ran out). Every
    decider must ``evolve`` it (usually into a condition or a phase); the worker decides
    again at once after appending it.

    Rows recorded before the worker stamped ``at`` and ``params`` lack them: they stay
    optional so old histories still read. Keyword-only, so the fields keep the order the
    worker has always written them in."""

    at: datetime | None = None
    action: str
    key: str
    params: RawJson | None = None
    error_class: str
    message: str
    retryable: bool | None = None
    attempts: int | None = None


@dataclass(frozen=True)
class WakeRequested(DomainEvent):
    """An operator made the machine due now (``cpctl wake``): recorded for who asked,
    it changes nothing in the state."""

    at: datetime


#: The engine's events every kind folds (``Submitted`` is never folded).
ENGINE_EVENTS: tuple[type[DomainEvent], ...] = (Queued, Admitted, ActionFailed, WakeRequested)
