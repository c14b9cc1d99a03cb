"""The ``drain`` machine's spec, state and ``evolve``.

The state is the plan (one :class:`Child` per pod to move, in plan order) plus what has
happened to it: the cordon (requested by us, or found already in place), each child's
progress (``Pending`` -> ``Started`` -> ``Finished`` | ``Refused`` | ``Skipped``), a
cancel, the uncordon, the end. Child ids are derived from the drain id and the pod UID
(:func:`child_id`), so re-performing a ``SubmitOperation`` never makes a second child.
Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.decider import ACTION_FAILED, EventLike
from controlplane.machines.base.codec import RawJson
from controlplane.machines.base.common import STARTED, event_time
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.states import PhasedState
from controlplane.machines.contract.actions import ActionType

KIND = "drain"
CORDON_REQUESTED = "CordonRequested"
NODE_CORDONED = "NodeCordoned"
CHILD_STARTED = "ChildStarted"
CHILD_FINISHED = "ChildFinished"
CHILDREN_SKIPPED = "ChildrenSkipped"
CANCEL_REQUESTED = "CancelRequested"
UNCORDON_REQUESTED = "UncordonRequested"
NODE_UNCORDONED = "NodeUncordoned"
FINISHED = "DrainFinished"


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

    @property
    def wake_keys(self) -> frozenset[str]:
        """The in-flight children's pod UIDs: their pod watch events wake the drain too."""
        if self.terminal:
            return frozenset()
        return frozenset(c.uid for c in self.children if c.in_flight)

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


def evolve_drain(state: DrainState, event: EventLike) -> DrainState:
    t, d = event.type, event.data
    if state.terminal:
        return state
    if t == STARTED:
        return replace(state, started_at=event_time(event))
    if t == CORDON_REQUESTED:
        return replace(state, cordon_requested_at=event_time(event), cordoned_by_us=True)
    if t == NODE_CORDONED:
        return replace(state, status=DrainPhase.DRAINING,
                       cordoned_by_us=not bool(d.get("already")))
    if t == CHILD_STARTED:
        return _child(state, str(d["child"]), status=ChildStatus.STARTED,
                      started_at=event_time(event))
    if t == CHILD_FINISHED:
        return _child(state, str(d["child"]), status=ChildStatus.FINISHED,
                      phase=str(d["phase"]), reason=str(d.get("reason") or ""),
                      finished_at=event_time(event))
    if t == CHILDREN_SKIPPED:
        skipped = set(map(str, d.get("children") or []))  # type: ignore[arg-type]
        return replace(state, children=tuple(
            replace(c, status=ChildStatus.SKIPPED, reason="drain cancelled before it started")
            if c.id in skipped else c for c in state.children))
    if t == CANCEL_REQUESTED:
        return replace(state, cancelled=True)
    if t == UNCORDON_REQUESTED:
        return replace(state, status=DrainPhase.UNCORDONING,
                       uncordon_requested_at=event_time(event))
    if t == NODE_UNCORDONED:
        return replace(state, cordoned_by_us=False)
    if t == FINISHED:
        return replace(state, status=DrainPhase(str(d["phase"])), reason=str(d["reason"]),
                       message=str(d["message"]))
    if t == ACTION_FAILED:
        return _action_failed(state, event)
    return state


def _action_failed(state: DrainState, event: EventLike) -> DrainState:
    d = event.data
    key, message = str(d.get("key")), f"{d.get('error_class')}: {d.get('message')}"
    for c in state.children:
        if key == submit_key(state.machine_id, c.id) and c.in_flight:
            return _child(state, c.id, status=ChildStatus.REFUSED, reason=message)
    if d.get("action") == ActionType.SET_NODE_UNSCHEDULABLE and not d.get("retryable"):
        return replace(state, node_error=message)
    # A retryable cordon failure: decide re-issues the action after the re-issue delay.
    return replace(state, cordon_requested_at=None if state.status is DrainPhase.CORDONING
                   else state.cordon_requested_at,
                   uncordon_requested_at=None if state.status is DrainPhase.UNCORDONING
                   else state.uncordon_requested_at)
