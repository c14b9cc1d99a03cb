"""The ``migration`` kind's own events, and the set of every event a migration folds.

A migration's history is its own events plus those of the four steps it composes
(capture, source, restore, collect) and the engine's. See
:mod:`controlplane.machines.base.events` for the wire format. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.machines.base.events import ENGINE_EVENTS, DomainEvent, EventSet, Started
from controlplane.machines.stages.capture import CAPTURE_EVENTS
from controlplane.machines.stages.collect import COLLECT_EVENTS
from controlplane.machines.stages.restore import RESTORE_EVENTS
from controlplane.machines.stages.source import SOURCE_EVENTS


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


@dataclass(frozen=True)
class AdoptionRequested(DomainEvent):
    """(``successor: adopt``) The restored pod is verified: the source was made the
    ReplicaSet's cheapest pod to delete and the restored pod given its labels back, so
    the ReplicaSet adopts it. ``attempt`` > 1 re-issues the same patches."""

    at: datetime
    attempt: int
    deadline: datetime | None = None


@dataclass(frozen=True)
class Adopted(DomainEvent):
    """The restored pod was observed owned by ``owner`` (``ReplicaSet/name``)."""

    at: datetime
    owner: str


@dataclass(frozen=True)
class AdoptionAbandoned(DomainEvent):
    """(``successor: adopt``) No restore could be verified while the source was kept:
    the source is woken in place instead."""

    at: datetime
    reason: str
    message: str


@dataclass(frozen=True)
class StreamDeclined(DomainEvent):
    """(``transfer: stream``) The target cannot take the stream (its runtime restores
    checkpoint images itself): this migration goes through the registry instead."""

    at: datetime
    reason: str


@dataclass(frozen=True)
class HandoffAbandoned(DomainEvent):
    """(``transfer: stream``) The restore from the source's stream failed before it was
    verified: the capture request is withdrawn (the source thaws in place) and the target
    pod removed."""

    at: datetime
    reason: str
    message: str


@dataclass(frozen=True)
class PagesTransferred(DomainEvent):
    """(mode ``lazy``) Every page reached the target: the source reported ``Transferred``
    with ``pages`` served (``bytes``; ``seconds`` from its freeze to its last page, when
    CRIU said), and the target received exactly the pages it expected. Only now may the
    source pod go."""

    at: datetime
    pages: int
    bytes: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class WorkloadLost(DomainEvent):
    """(mode ``lazy``) The target ran, but its pages stopped before they all arrived (a
    lost page server or lazy-pages daemon, or the transfer deadline): the workload is
    gone. What is left of both pods is removed; the source is never woken."""

    at: datetime
    reason: str
    message: str


MIGRATION_EVENTS = EventSet(
    ENGINE_EVENTS, (Started, MigrationFinished, Retargeted, MigrationCancelRequested,
                    RollbackStarted, AdoptionRequested, Adopted, AdoptionAbandoned,
                    StreamDeclined, HandoffAbandoned, PagesTransferred, WorkloadLost),
    CAPTURE_EVENTS, SOURCE_EVENTS, RESTORE_EVENTS, COLLECT_EVENTS)
