"""Typed events for the machines: the base and the engine's own events, re-exported from
:mod:`controlplane.engine.events` (where the store and the worker can build them too), and
the events several product kinds record (``Started``, ``Finished``, ``CancelRequested``).

An event type is one frozen dataclass deriving from :class:`DomainEvent`; a kind's
``evolve`` decodes the recorded ``(type, data)`` once with its :class:`EventSet` and
dispatches on the class. The wire format is described in :mod:`controlplane.engine.events`.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.engine.events import (
    ENGINE_EVENTS,
    ActionFailed,
    Admitted,
    DomainEvent,
    EventSet,
    Queued,
    Submitted,
    UnknownEvent,
    WakeRequested,
)

__all__ = [
    "ENGINE_EVENTS", "ActionFailed", "Admitted", "CancelRequested", "DomainEvent", "EventSet",
    "Finished", "Queued", "Started", "Submitted", "UnknownEvent", "WakeRequested",
]


# --- the opening every product kind records -----------------------------------------------


@dataclass(frozen=True)
class Started(DomainEvent):
    """The machine's first decision: it is running (``kind`` as submitted; a drain adds
    its ``node``, a migration its ``target``)."""

    at: datetime
    kind: str
    node: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class Finished(DomainEvent):
    """How a checkpoint, restore, suspend or resume ended (each kind records its own
    subclass: ``CheckpointFinished``, ...)."""

    at: datetime
    phase: str
    reason: str
    message: str


@dataclass(frozen=True)
class CancelRequested(DomainEvent):
    """The operator's ``Cancel``, for the kinds whose cancel carries no data."""

    at: datetime

