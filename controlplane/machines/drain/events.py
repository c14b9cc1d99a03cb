"""The ``drain`` machine's events: one frozen dataclass per type, and the set it folds.

Each class declares exactly the data keys the drain has always recorded, in that order
(``at``, the decision time, first); phases and statuses are recorded as their values.
See :mod:`controlplane.machines.base.events` for the wire format. Produced by
:mod:`~controlplane.machines.drain.machine`, folded by
:func:`~controlplane.machines.drain.state.evolve_drain` through :data:`DRAIN_EVENTS`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.machines.base.codec import RawJson
from controlplane.machines.base.events import ENGINE_EVENTS, DomainEvent, EventSet, Started


@dataclass(frozen=True)
class CordonRequested(DomainEvent):
    """The cordon action was issued (``SetNodeUnschedulable``)."""

    at: datetime
    node: str


@dataclass(frozen=True)
class NodeCordoned(DomainEvent):
    """The node was observed unschedulable; ``already``: it was before the drain asked."""

    at: datetime
    node: str
    already: bool


@dataclass(frozen=True)
class ChildStarted(DomainEvent):
    """A child migration was submitted; ``in_flight`` counts it."""

    at: datetime
    child: str
    pod: str
    uid: str
    target: str
    in_flight: int


@dataclass(frozen=True)
class ChildFinished(DomainEvent):
    """A child migration was observed terminal, in ``phase``."""

    at: datetime
    child: str
    pod: str
    target: str
    phase: str
    reason: str
    succeeded: bool


@dataclass(frozen=True)
class ChildrenSkipped(DomainEvent):
    """The drain was cancelled: these pending children will never start."""

    at: datetime
    children: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class DrainCancelRequested(DomainEvent, name="CancelRequested"):
    """The operator cancelled the drain (children then in flight and pending)."""

    at: datetime
    in_flight: int
    pending: int


@dataclass(frozen=True)
class UncordonRequested(DomainEvent):
    """The uncordon action was issued (a cancelled drain that cordoned the node)."""

    at: datetime
    node: str


@dataclass(frozen=True)
class NodeUncordoned(DomainEvent):
    """The node was observed schedulable again (or gone)."""

    at: datetime
    node: str


@dataclass(frozen=True)
class ChildOutcome:
    """One child as the drain ended (in :class:`DrainFinished`); ``status`` is a
    ``ChildStatus`` value."""

    child: str
    pod: str
    target: str
    status: str
    phase: str
    reason: str


@dataclass(frozen=True)
class DrainFinished(DomainEvent):
    """The drain ended in ``phase`` (a terminal ``DrainPhase`` value), with its counts."""

    at: datetime
    phase: str
    reason: str
    message: str
    children: int
    succeeded: int
    failed: int
    skipped: int
    in_flight: int
    children_outcomes: tuple[ChildOutcome, ...]


@dataclass(frozen=True)
class NodeRecheckRequested(DomainEvent):
    """Every child settled: the drain asks for its node's pods again (request ``check``,
    counted from 1), to move those that reached the node after the plan."""

    at: datetime
    node: str
    check: int


@dataclass(frozen=True)
class LateChild:
    """A pod found on the node after the plan, and how it moves (in :class:`PlanExtended`):
    ``successor`` as in the spec's children (``""``: a bare pod)."""

    child: str
    namespace: str
    name: str
    uid: str
    target: str
    successor: str
    template: RawJson


@dataclass(frozen=True)
class LateLeft:
    """A pod found on the node after the plan that the drain leaves alone, and why (the
    planner's rules: refused pods stay refused)."""

    pod: str
    reason: str


@dataclass(frozen=True)
class PlanExtended(DomainEvent):
    """The answer to request ``check`` named pods on the node the plan did not have:
    ``children`` join the plan (moved like the planned ones), ``left`` are left alone."""

    at: datetime
    node: str
    check: int
    children: tuple[LateChild, ...]
    left: tuple[LateLeft, ...]


@dataclass(frozen=True)
class NodeRechecked(DomainEvent):
    """Request ``check`` answered: ``joined`` pods joined the plan; ``starting`` are pods
    on the node not Running yet (nothing to checkpoint yet: looked at again)."""

    at: datetime
    node: str
    check: int
    joined: int
    starting: tuple[str, ...]


DRAIN_EVENTS = EventSet(ENGINE_EVENTS, [
    Started, CordonRequested, NodeCordoned, ChildStarted, ChildFinished, ChildrenSkipped,
    DrainCancelRequested, UncordonRequested, NodeUncordoned, DrainFinished,
    NodeRecheckRequested, PlanExtended, NodeRechecked,
])
