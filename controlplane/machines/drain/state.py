"""The ``drain`` machine's spec, state and ``evolve``.

The state is the plan (one :class:`Child` per pod to move, in plan order) plus what has
happened to it: the cordon (requested by us, or found already in place), each child's
progress (``Pending`` -> ``Started`` -> ``Finished`` | ``Refused`` | ``Skipped``), a
cancel, the uncordon, the end, and the pods that joined the plan after it was made
(``PlanExtended``: appended to the children and to ``left``, listed in ``extensions``).
Child ids are derived from the drain id and the pod UID (:func:`child_id`), so
re-performing a ``SubmitOperation`` never makes a second child. Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.decider import EventLike
from controlplane.machines.base.codec import OMIT_DEFAULT, RawJson
from controlplane.machines.base.events import (
    ActionFailed,
    Admitted,
    DomainEvent,
    Queued,
    Started,
    UnknownEvent,
    WakeRequested,
)
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.states import PhasedState
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.events import (
    DRAIN_EVENTS,
    ChildFinished,
    ChildrenSkipped,
    ChildStarted,
    CordonRequested,
    DrainCancelRequested,
    DrainFinished,
    NodeCordoned,
    NodeRechecked,
    NodeRecheckRequested,
    NodeUncordoned,
    PlanExtended,
    UncordonRequested,
)

KIND = "drain"


class DrainPhase(StrEnum):
    CORDONING = "Cordoning"
    DRAINING = "Draining"
    UNCORDONING = "Uncordoning"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({DrainPhase.SUCCEEDED, DrainPhase.FAILED, DrainPhase.CANCELLED})


class ChildStatus(StrEnum):
    PENDING = "Pending"  # planned, not started
    STARTED = "Started"  # submitted (running or held by admission): in flight
    FINISHED = "Finished"  # the child migration is terminal; ``phase`` says how
    REFUSED = "Refused"  # submission refused for good (pod gone, workload busy...)
    SKIPPED = "Skipped"  # never started: the drain was cancelled first


def child_id(drain_id: str, pod_uid: str) -> str:
    """The child migration's machine id: the same for the same drain and pod, always."""
    digest = hashlib.sha256(f"{drain_id}/{pod_uid}".encode()).hexdigest()[:12]
    return f"{drain_id[:51]}-{digest}"


def submit_key(drain_id: str, child: str) -> str:
    return f"{drain_id}:submit:{child}"


def machine_key(machine_id: str) -> str:
    """The wake key of machine ``machine_id`` ending: a parent indexes its in-flight
    children's, and the worker wakes it when one of them turns terminal
    (:func:`controlplane.worker.child_machines.wake_parents`)."""
    return f"machine:{machine_id}"


@dataclass(frozen=True)
class Child:
    id: str
    namespace: str
    name: str
    uid: str
    target: str
    template: RawJson
    status: ChildStatus = ChildStatus.PENDING
    phase: str = ""  # the child machine's terminal phase
    reason: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: The child migration's ``successor`` (``adopt``: a ReplicaSet's pod, ``gated``: a
    #: StatefulSet's), or ``""``.
    successor: str = field(default="", metadata=OMIT_DEFAULT)
    #: When a pod found on the node after the plan joined it (``PlanExtended``); ``None``
    #: for a planned one.
    joined_at: datetime | None = field(default=None, metadata=OMIT_DEFAULT)

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def in_flight(self) -> bool:
        return self.status is ChildStatus.STARTED

    @property
    def succeeded(self) -> bool:
        return self.status is ChildStatus.FINISHED and self.phase == "Succeeded"


@dataclass(frozen=True)
class DrainSpec:
    node: str
    max_parallel: int
    klass: RawJson
    left: tuple[tuple[str, str], ...]  # (pod key, why the drain leaves it alone)
    #: Each moved pod keeps its name (its migration's keep_name); drains recorded before
    #: this field existed did not.
    keep_names: bool = field(default=False, metadata=OMIT_DEFAULT)
    #: Before it ends, the drain looks for pods that reached the node after the plan and
    #: moves them too, planned with the plan's ``targets`` and ``selector``. Drains
    #: recorded before this field existed did not look.
    late_pods: bool = field(default=False, metadata=OMIT_DEFAULT)
    targets: tuple[str, ...] = field(default=(), metadata=OMIT_DEFAULT)
    selector: str = field(default="", metadata=OMIT_DEFAULT)


@dataclass(frozen=True)
class Extension:
    """One ``PlanExtended``: when, and which pods joined the plan or were left alone."""

    at: datetime
    check: int
    joined: tuple[str, ...]
    left: tuple[str, ...]


@dataclass(frozen=True)
class DrainState(PhasedState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: DrainSpec
    children: tuple[Child, ...]
    status: DrainPhase = DrainPhase.CORDONING
    started_at: datetime | None = None
    cordon_requested_at: datetime | None = None
    cordoned_by_us: bool = False
    cancelled: bool = False
    uncordon_requested_at: datetime | None = None
    #: A cordon/uncordon that failed for good (e.g. 403): the drain ends Failed.
    node_error: str = ""
    reason: str = ""
    message: str = ""
    #: Looking for pods that reached the node after the plan (``spec.late_pods``): the
    #: requests made, the last one answered, what that answer found.
    checks: int = field(default=0, metadata=OMIT_DEFAULT)
    check_requested_at: datetime | None = field(default=None, metadata=OMIT_DEFAULT)
    checked: int = field(default=0, metadata=OMIT_DEFAULT)
    checked_joined: int = field(default=0, metadata=OMIT_DEFAULT)
    #: Pods on the node not Running yet at the last answer, and since when there were some.
    starting: tuple[str, ...] = field(default=(), metadata=OMIT_DEFAULT)
    starting_since: datetime | None = field(default=None, metadata=OMIT_DEFAULT)
    extensions: tuple[Extension, ...] = field(default=(), metadata=OMIT_DEFAULT)

    @property
    def check_open(self) -> bool:
        """A request for the node's pods is not answered yet."""
        return self.checks > self.checked

    @property
    def wake_keys(self) -> frozenset[str]:
        """The in-flight children's :func:`machine_key`: the worker wakes the drain when
        one of them ends, the only change of a child the drain decides on. (Their pods'
        watch events woke it before; that was a stand-in for this, at one read of every
        child in flight per pod event.)"""
        if self.terminal:
            return frozenset()
        return frozenset(machine_key(c.id) for c in self.children if c.in_flight)

    @property
    def in_flight(self) -> tuple[Child, ...]:
        return tuple(c for c in self.children if c.in_flight)

    @property
    def pending(self) -> tuple[Child, ...]:
        return tuple(c for c in self.children if c.status is ChildStatus.PENDING)

    def counts(self) -> dict[str, int]:
        done = [c for c in self.children if c.status is ChildStatus.FINISHED]
        return {"children": len(self.children),
                "succeeded": sum(1 for c in done if c.succeeded),
                "failed": sum(1 for c in done if not c.succeeded)
                + sum(1 for c in self.children if c.status is ChildStatus.REFUSED),
                "skipped": sum(1 for c in self.children if c.status is ChildStatus.SKIPPED),
                "in_flight": len(self.in_flight)}


def _child(state: DrainState, cid: str, **changes: Any) -> DrainState:
    return replace(state, children=tuple(replace(c, **changes) if c.id == cid else c
                                         for c in state.children))


def evolve_drain(state: DrainState, recorded: EventLike | DomainEvent) -> DrainState:
    """Fold one event; an event the drain does not record raises ``UnknownEvent``."""
    event = DRAIN_EVENTS.decode(recorded)
    if state.terminal:
        return state
    match event:
        case Started(at=at):
            return replace(state, started_at=at)
        case CordonRequested(at=at):
            return replace(state, cordon_requested_at=at, cordoned_by_us=True)
        case NodeCordoned(already=already):
            return replace(state, status=DrainPhase.DRAINING, cordoned_by_us=not already)
        case ChildStarted(at=at, child=child):
            return _child(state, child, status=ChildStatus.STARTED, started_at=at)
        case ChildFinished(at=at, child=child, phase=phase, reason=reason):
            return _child(state, child, status=ChildStatus.FINISHED, phase=phase,
                          reason=reason, finished_at=at)
        case ChildrenSkipped(children=children):
            skipped = set(children)
            return replace(state, children=tuple(
                replace(c, status=ChildStatus.SKIPPED,
                        reason="drain cancelled before it started")
                if c.id in skipped else c for c in state.children))
        case DrainCancelRequested():
            return replace(state, cancelled=True)
        case UncordonRequested(at=at):
            return replace(state, status=DrainPhase.UNCORDONING, uncordon_requested_at=at)
        case NodeUncordoned():
            return replace(state, cordoned_by_us=False)
        case NodeRecheckRequested(at=at, check=check):
            return replace(state, checks=check, check_requested_at=at)
        case PlanExtended():
            return _extended(state, event)
        case NodeRechecked(at=at, check=check, joined=joined, starting=starting):
            since = (state.starting_since or at) if starting else None
            return replace(state, checked=check, checked_joined=joined, starting=starting,
                           starting_since=since)
        case DrainFinished(phase=phase, reason=reason, message=message):
            return replace(state, status=DrainPhase(phase), reason=reason, message=message)
        case ActionFailed():
            return _action_failed(state, event)
        case Queued() | Admitted() | WakeRequested():
            return state
    raise UnknownEvent(f"event {event.NAME!r} is in DRAIN_EVENTS but the drain does not "
                       "fold it")


def _extended(state: DrainState, event: PlanExtended) -> DrainState:
    joined = tuple(Child(c.child, c.namespace, c.name, c.uid, c.target, c.template,
                         successor=c.successor, joined_at=event.at) for c in event.children)
    extension = Extension(event.at, event.check, tuple(c.pod_key for c in joined),
                          tuple(x.pod for x in event.left))
    spec = replace(state.spec, left=state.spec.left + tuple((x.pod, x.reason)
                                                            for x in event.left))
    return replace(state, spec=spec, children=state.children + joined,
                   extensions=(*state.extensions, extension))


def _action_failed(state: DrainState, failed: ActionFailed) -> DrainState:
    key, message = failed.key, f"{failed.error_class}: {failed.message}"
    for c in state.children:
        if key == submit_key(state.machine_id, c.id) and c.in_flight:
            return _child(state, c.id, status=ChildStatus.REFUSED, reason=message)
    if failed.action == ActionType.SET_NODE_UNSCHEDULABLE and not failed.retryable:
        return replace(state, node_error=message)
    # A retryable cordon failure: decide re-issues the action after the re-issue delay.
    return replace(state, cordon_requested_at=None if state.status is DrainPhase.CORDONING
                   else state.cordon_requested_at,
                   uncordon_requested_at=None if state.status is DrainPhase.UNCORDONING
                   else state.uncordon_requested_at)
