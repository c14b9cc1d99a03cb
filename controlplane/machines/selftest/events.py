"""The ``steps`` machine's events: one frozen dataclass per type, and the set it folds.

Each class declares exactly the data keys the kind has always recorded (see
:mod:`controlplane.machines.base.events` for the wire format). Produced and folded by
:mod:`~controlplane.machines.selftest.steps` through :data:`STEPS_EVENTS`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.machines.base.events import ENGINE_EVENTS, DomainEvent, EventSet


@dataclass(frozen=True)
class StepCompleted(DomainEvent):
    """Step ``step`` (1-based) is done; ``payload`` is ``payload_bytes`` of filler."""

    step: int
    payload: str


@dataclass(frozen=True)
class GateArmed(DomainEvent):
    """Waiting for the gate pod began; the machine fails if it has not run by ``deadline``."""

    deadline: datetime


@dataclass(frozen=True)
class GateOpened(DomainEvent):
    """The gate pod was observed Running with its UID (the facts say so)."""


@dataclass(frozen=True)
class GateTimedOut(DomainEvent):
    """The deadline passed before the gate pod ran."""

    reason: str


@dataclass(frozen=True)
class Cancelled(DomainEvent):
    """The operator cancelled the machine after ``at_step`` steps."""

    at_step: int


STEPS_EVENTS = EventSet(ENGINE_EVENTS, [StepCompleted, GateArmed, GateOpened, GateTimedOut,
                                        Cancelled])
