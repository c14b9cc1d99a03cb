"""The ``migration`` machine's state and ``evolve``.

The state folds the capture, source, restore and collection steps' events plus the
migration's own (``Retargeted``, ``CancelRequested``, ``SourceDeletionAborted``,
``SourceVanished``, ``RollbackStarted``, ``MigrationFinished``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.decider import EventLike
from controlplane.machines.base.codec import RawJson
from controlplane.machines.base.common import (
    STARTED,
    Condition,
    Failure,
    clear_condition,
    event_time,
    seconds,
    set_condition,
)
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.states import PhasedState
from controlplane.machines.config.classes import CheckpointClass
from controlplane.machines.steps import capture as cap_
from controlplane.machines.steps import collect as gc_
from controlplane.machines.steps import restore as rs_
from controlplane.machines.steps import source as src_
from controlplane.machines.steps.capture import Capture, CaptureSpec
from controlplane.machines.steps.collect import Collection
from controlplane.machines.steps.restore import Restore, RestoreContext
from controlplane.machines.steps.source import SourceOp, SourcePod

KIND = "migration"
FINISHED = "MigrationFinished"
RETARGETED = "Retargeted"
CANCEL_REQUESTED = "CancelRequested"
ABORTED = src_.DELETION_ABORTED
SOURCE_VANISHED = src_.SOURCE_VANISHED
ROLLBACK_STARTED = "RollbackStarted"
GC_CONDITION = "GarbageCollectionFailed"


class MigrationPhase(StrEnum):
    CHECKPOINTING = "Checkpointing"
    UNSTICKING = "Unsticking"
    WAKING_IN_PLACE = "WakingInPlace"
    DELETING_SOURCE = "DeletingSource"
    RESTORING = "Restoring"
    ROLLING_BACK = "RollingBack"
    COLLECTING_GARBAGE = "CollectingGarbage"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    CANCELLED = "Cancelled"
    FAILED = "Failed"
    GC_FAILED = "GarbageCollectionFailed"


TERMINAL = frozenset({MigrationPhase.SUCCEEDED, MigrationPhase.ROLLED_BACK,
                      MigrationPhase.CANCELLED, MigrationPhase.FAILED, MigrationPhase.GC_FAILED})


@dataclass(frozen=True)
class MigrationSpec:
    capture: CaptureSpec
    source_node: str
    template: RawJson
    restore_name: str


@dataclass(frozen=True)
class MigrationState(PhasedState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: MigrationSpec
    klass: CheckpointClass
    target: str
    status: MigrationPhase = MigrationPhase.CHECKPOINTING
    started_at: datetime | None = None
    capture: Capture = field(default_factory=Capture)
    verified_at: datetime | None = None
    source_op: SourceOp | None = None
    deletion_requested: bool = False
    source_gone: bool = False
    restore: Restore | None = None
    attempts: int = 0
    failures: int = 0
    rollback: bool = False
    cancelled: bool = False
    abort: Failure | None = None
    collection: Collection | None = None
    failure: Failure | None = None
    final_node: str | None = None
    conditions: tuple[Condition, ...] = ()


    @property
    def wake_keys(self) -> frozenset[str]:
        if self.terminal:
            return frozenset()
        keys: set[str] = set()
        if not self.source_gone:
            keys.add(self.spec.capture.uid)
        if self.restore is not None:
            keys.add(self.restore.plan.key)
            if self.restore.uid:
                keys.add(self.restore.uid)
        return frozenset(keys)

    @property
    def source(self) -> SourcePod:
        c = self.spec.capture
        return SourcePod(c.namespace, c.name, c.uid, c.checkpoint_id)

    @property
    def pinned(self) -> str | None:
        d = self.capture.digest
        return None if d is None else self.spec.capture.pinned(d)

    def context(self) -> RestoreContext:
        t = self.klass.timeouts
        return RestoreContext(template=self.spec.template,
                              loader=self.klass.loader_annotation(),
                              schedule_timeout=t.schedule, restore_timeout=t.restore,
                              cleanup_timeout=t.release)



def evolve_migration(state: MigrationState, event: EventLike) -> MigrationState:
    """Fold one event into a migration's state; terminal states absorb everything."""
    t, d = event.type, event.data
    if state.terminal:
        return state
    if t == STARTED:
        return replace(state, started_at=event_time(event))
    if t == FINISHED:
        phase = MigrationPhase(str(d["phase"]))
        failure = state.failure
        if phase in (MigrationPhase.FAILED, MigrationPhase.GC_FAILED):
            failure = Failure(str(d["reason"]), str(d["message"]))
        node = d.get("final_node")
        return replace(state, status=phase, failure=failure,
                       final_node=None if node is None else str(node))
    if t in (RETARGETED, CANCEL_REQUESTED, ABORTED, SOURCE_VANISHED, ROLLBACK_STARTED):
        return _evolve_own(state, event)
    mid = state.machine_id
    capture = cap_.evolve_capture(state.capture, event, machine_id=mid)
    source_op = src_.evolve_source_op(state.source_op, event, machine_id=mid)
    restore = rs_.evolve_restore(state.restore, event, machine_id=mid)
    collection = None if state.collection is None else gc_.evolve_collection(
        state.collection, event, machine_id=mid)
    # An event moves at most one step; copy the 21-field state only when one did.
    if (capture is not state.capture or source_op is not state.source_op
            or restore is not state.restore or collection is not state.collection):
        state = replace(state, capture=capture, source_op=source_op, restore=restore,
                        collection=collection)
    return _evolve_steps(state, event)


def _evolve_own(state: MigrationState, event: EventLike) -> MigrationState:
    t, d = event.type, event.data
    if t == RETARGETED:
        node = str(d["node"])
        if d.get("wake_in_place"):
            return replace(state, target=node, status=MigrationPhase.WAKING_IN_PLACE)
        if state.status is MigrationPhase.ROLLING_BACK:
            return replace(state, target=node, status=MigrationPhase.RESTORING)
        return replace(state, target=node)
    if t == CANCEL_REQUESTED:
        if d.get("before_deletion"):
            return replace(state, cancelled=True, status=MigrationPhase.WAKING_IN_PLACE)
        return replace(state, cancelled=True, target=state.spec.source_node)
    if t == ABORTED:
        return replace(state, status=MigrationPhase.WAKING_IN_PLACE,
                       abort=Failure(str(d["reason"]), str(d["message"])))
    if t == SOURCE_VANISHED:
        return replace(state, source_gone=True, status=MigrationPhase.RESTORING,
                       target=str(d.get("target", state.target)))
    # ROLLBACK_STARTED
    return replace(state, rollback=True, target=state.spec.source_node,
                   status=MigrationPhase.ROLLING_BACK)


def _evolve_steps(state: MigrationState, event: EventLike) -> MigrationState:
    t = event.type
    if t == cap_.ARTIFACT_VERIFIED and state.status is MigrationPhase.CHECKPOINTING:
        return replace(state, status=MigrationPhase.DELETING_SOURCE,
                       verified_at=event_time(event))
    if t == cap_.CAPTURE_FAILED and state.status is MigrationPhase.CHECKPOINTING:
        return replace(state, status=MigrationPhase.UNSTICKING, failure=state.capture.failure)
    if t == "SourceDeletionRequested":
        return replace(state, deletion_requested=True)
    if t == "SourceDeleted" and state.status is MigrationPhase.DELETING_SOURCE:
        return replace(state, source_gone=True, status=MigrationPhase.RESTORING)
    if t == "SourceDeletionFailed" and state.source_op is not None and \
            state.status is MigrationPhase.DELETING_SOURCE:
        return replace(state, status=MigrationPhase.WAKING_IN_PLACE,
                       abort=state.source_op.failure)
    if t == rs_.RESTORE_POD_REQUESTED and "plan" in event.data:
        return replace(state, attempts=state.attempts + 1)
    if t == rs_.RESTORE_FAILED and state.restore is not None and not state.restore.superseded:
        return replace(state, failures=state.failures + 1)
    if t == rs_.RESTORE_VERIFIED and state.restore is not None:
        pinned = state.pinned  # parses the artifact reference: once
        assert pinned is not None
        deadline = event_time(event) + seconds(state.klass.timeouts.gc)
        return replace(state, status=MigrationPhase.COLLECTING_GARBAGE,
                       final_node=state.restore.node or state.restore.plan.node,
                       collection=Collection(pinned=pinned, deadline=deadline))
    if t == gc_.ARTIFACT_DELETION_FAILED and state.collection is not None:
        return replace(state, conditions=set_condition(state.conditions, Condition(
            GC_CONDITION, str(event.data.get("error_class", "")),
            str(event.data.get("message", "")), event_time(event))))
    if t == gc_.ARTIFACT_DELETED:
        return replace(state, conditions=clear_condition(state.conditions, GC_CONDITION))
    return state


