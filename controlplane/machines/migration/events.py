"""The ``migration`` kind's own events, and the set of every event a migration folds.

A migration's history is its own events plus those of the four steps it composes
(capture, source, restore, collect) and the engine's. See
:mod:`controlplane.machines.base.events` for the wire format. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.machines.base.events import ENGINE_EVENTS, DomainEvent, EventSet, Started
from controlplane.machines.steps.capture import CAPTURE_EVENTS
from controlplane.machines.steps.collect import COLLECT_EVENTS
from controlplane.machines.steps.restore import RESTORE_EVENTS
from controlplane.machines.steps.source import SOURCE_EVENTS


@dataclass(frozen=True)
class MigrationFinished(DomainEvent):
    """The migration ended in ``phase``; ``final_node`` is where the workload runs (``null``
    when it runs nowhere)."""

    at: datetime
    phase: str
    reason: str
    message: str
    final_node: str | None


@dataclass(frozen=True)
class Retargeted(DomainEvent):
    """The operator chose another target; back to the source is a wake in place while
    the source still exists."""

    at: datetime
    node: str
    previous: str
    wake_in_place: bool


@dataclass(frozen=True)
class MigrationCancelRequested(DomainEvent, name="CancelRequested"):
    at: datetime
    before_deletion: bool


@dataclass(frozen=True)
class RollbackStarted(DomainEvent):
    """The restore on the target failed: restore on the source ``node`` instead."""

    at: datetime
    failed_node: str | None
    reason: str
    message: str
    node: str


MIGRATION_EVENTS = EventSet(
    ENGINE_EVENTS, (Started, MigrationFinished, Retargeted, MigrationCancelRequested,
                    RollbackStarted),
    CAPTURE_EVENTS, SOURCE_EVENTS, RESTORE_EVENTS, COLLECT_EVENTS)
