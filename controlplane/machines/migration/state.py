"""The ``migration`` machine's state and ``evolve``.

The state folds the capture, source, restore and collection steps' events plus the
migration's own (``Retargeted``, ``CancelRequested``, ``SourceDeletionAborted``,
``SourceVanished``, ``RollbackStarted``, ``MigrationFinished``; a lazy migration's
``PagesTransferred`` and ``WorkloadLost``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.decider import EventLike
from controlplane.machines.base.codec import OMIT_DEFAULT, RawJson
from controlplane.machines.base.events import DomainEvent, Started
from controlplane.machines.base.failures import Condition, Failure, clear_condition, set_condition
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.states import PhasedState
from controlplane.machines.base.timing import seconds
from controlplane.machines.config.classes import CheckpointClass
from controlplane.machines.migration.events import (
    MIGRATION_EVENTS,
    Adopted,
    AdoptionAbandoned,
    AdoptionRequested,
    HandoffAbandoned,
    MigrationCancelRequested,
    MigrationFinished,
    PagesTransferred,
    Retargeted,
    RollbackStarted,
    StreamDeclined,
    WorkloadLost,
)
from controlplane.machines.stages import capture as cap_
from controlplane.machines.stages import collect as gc_
from controlplane.machines.stages import restore as rs_
from controlplane.machines.stages import source as src_
from controlplane.machines.stages.capture import (
    ArtifactVerified,
    Capture,
    CaptureFailed,
    CaptureSpec,
)
from controlplane.machines.stages.collect import ArtifactDeleted, ArtifactDeletionFailed, Collection
from controlplane.machines.stages.restore import (
    Restore,
    RestoreCleanedUp,
    RestoreContext,
    RestoreFailed,
    RestorePlan,
    RestorePodRequested,
    RestoreVerified,
)
from controlplane.machines.stages.source import (
    SourceDeleted,
    SourceDeletionAborted,
    SourceDeletionFailed,
    SourceDeletionRequested,
    SourceOp,
    SourcePod,
    SourceVanished,
)

KIND = "migration"
ADOPT = "adopt"
GATED = "gated"
SUCCESSORS = (ADOPT, GATED)
GC_CONDITION = "GarbageCollectionFailed"


class MigrationPhase(StrEnum):
    CHECKPOINTING = "Checkpointing"
    UNSTICKING = "Unsticking"
    WAKING_IN_PLACE = "WakingInPlace"
    DELETING_SOURCE = "DeletingSource"
    RESTORING = "Restoring"
    ADOPTING = "Adopting"
    ROLLING_BACK = "RollingBack"
    COLLECTING_GARBAGE = "CollectingGarbage"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    CANCELLED = "Cancelled"
    FAILED = "Failed"
    GC_FAILED = "GarbageCollectionFailed"
    #: (mode ``lazy``) The target runs; its pages are still arriving from the source.
    TARGET_RUNNING = "TargetRunning"
    #: (mode ``lazy``) The pages stopped after the target ran: removing what is left.
    CLEARING_LOST = "ClearingLostWorkload"


TERMINAL = frozenset({MigrationPhase.SUCCEEDED, MigrationPhase.ROLLED_BACK,
                      MigrationPhase.CANCELLED, MigrationPhase.FAILED, MigrationPhase.GC_FAILED})


@dataclass(frozen=True)
class MigrationSpec:
    capture: CaptureSpec
    source_node: str
    template: RawJson
    restore_name: str
    #: The restored pod is named ``restore_name`` itself (no suffix), once no pod holds it.
    keep_name: bool = field(default=False, metadata=OMIT_DEFAULT)
    #: How the source's controller takes the restored pod: ``""`` (a bare pod: delete the
    #: source, then restore), ``"adopt"`` (a ReplicaSet's pod: restore beside the
    #: quiesced source with the labels parked, then hand the labels back so the
    #: ReplicaSet adopts it, then delete the source; see ``phases._adopt``) or ``"gated"``
    #: (a StatefulSet's pod: delete the source, then claim the successor the controller
    #: recreates under the same name, held by the webhook's scheduling gate; see
    #: ``steps.restore``, claim mode).
    successor: str = field(default="", metadata=OMIT_DEFAULT)
    #: Keep the checkpoint in the registry after the verified restore, whatever the
    #: class's retention says (false for every history recorded before it existed).
    keep_checkpoint: bool = field(default=False, metadata=OMIT_DEFAULT)
    #: ``transfer: stream`` chosen (``initial_state``, from the class and the successor):
    #: the capture is also handed to the target's agent, the restore pod created at once
    #: beside the frozen source, which is deleted only once the target runs verified.
    stream: bool = field(default=False, metadata=OMIT_DEFAULT)
    #: Mode ``lazy`` (post-copy): handed off like a stream, but nothing is pushed; the
    #: target runs before its memory arrived, and the source goes only after every page.
    lazy: bool = field(default=False, metadata=OMIT_DEFAULT)

    @property
    def adopts(self) -> bool:
        return self.successor == ADOPT

    @property
    def claims(self) -> bool:
        return self.successor == GATED

    @property
    def name_key(self) -> str:
        """``namespace/restore_name``: the pod that must be gone before a kept name is used."""
        return f"{self.capture.namespace}/{self.restore_name}"


@dataclass(frozen=True)
class Adoption:
    """The hand-over of a restored pod to the source's ReplicaSet: requested (the source
    made the cheapest to delete, the restored pod given its labels back) at
    ``requested_at``, bounded by ``deadline``; ``owner`` (``ReplicaSet/name``) once the
    restored pod was observed owned."""

    requested_at: datetime
    deadline: datetime
    attempt: int = 1
    owner: str = ""


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
    #: With a kept name: since when the next restore attempt is due (the wait for the
    #: name is bounded from here).
    restore_due_at: datetime | None = field(default=None, metadata=OMIT_DEFAULT)
    #: Adoption (``successor: adopt``): the labels handed back, and who took the pod.
    adoption: Adoption | None = field(default=None, metadata=OMIT_DEFAULT)
    #: Why a streamed migration went through the registry after all (its target's runtime).
    stream_declined: str = field(default="", metadata=OMIT_DEFAULT)
    #: (mode ``lazy``) Until when the pages may take to arrive once the target runs.
    transfer_deadline: datetime | None = field(default=None, metadata=OMIT_DEFAULT)

    @property
    def streams(self) -> bool:
        """The checkpoint is handed to the target's agent (streamed, or lazily), and the
        source kept until the target runs."""
        return (self.spec.stream or self.spec.lazy) and not self.stream_declined

    @property
    def target_ran(self) -> bool:
        """(lazy) The target ran: from now on the source is never woken."""
        return self.spec.lazy and self.status in (
            MigrationPhase.TARGET_RUNNING, MigrationPhase.CLEARING_LOST,
            MigrationPhase.DELETING_SOURCE)

    @property
    def beside_source(self) -> bool:
        """The restore runs while the (frozen) source still exists: adoption or a stream."""
        return (self.spec.adopts or self.streams) and not self.source_gone

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
        if self.spec.keep_name:
            keys.add(self.spec.name_key)  # its holder going away frees the name
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
        template = self.spec.template
        if self.beside_source:
            template = parked(template)
        return RestoreContext(template=template,
                              loader=self.klass.loader_annotation(),
                              unseal=self.klass.unseal_annotation(),
                              schedule_timeout=t.schedule, restore_timeout=t.restore,
                              cleanup_timeout=t.release)



def parked(template: RawJson) -> RawJson:
    """The template without its labels: a restored pod its ReplicaSet must not count (or
    Services route to) until it is verified and handed over."""
    meta = template.get("metadata")
    if not isinstance(meta, dict) or not meta.get("labels"):
        return template
    return {**template, "metadata": {k: v for k, v in meta.items() if k != "labels"}}


def template_labels(template: RawJson) -> dict[str, str]:
    meta = template.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def evolve_migration(state: MigrationState, event: EventLike | DomainEvent) -> MigrationState:
    """Fold one event into a migration's state; terminal states absorb everything.
    An event type a migration does not record raises ``UnknownEvent``."""
    e = MIGRATION_EVENTS.decode(event)
    if state.terminal:
        return state
    match e:
        case Started():
            return replace(state, started_at=e.at)
        case MigrationFinished():
            phase = MigrationPhase(e.phase)
            failure = state.failure
            if phase in (MigrationPhase.FAILED, MigrationPhase.GC_FAILED):
                failure = Failure(e.reason, e.message)
            return replace(state, status=phase, failure=failure, final_node=e.final_node)
        case Retargeted() | MigrationCancelRequested() | SourceDeletionAborted() | \
                SourceVanished() | RollbackStarted() | AdoptionRequested() | Adopted() | \
                AdoptionAbandoned() | StreamDeclined() | HandoffAbandoned() | \
                PagesTransferred() | WorkloadLost():
            return _evolve_own(state, e)
    mid = state.machine_id
    capture = cap_.evolve_capture(state.capture, e, machine_id=mid)
    source_op = src_.evolve_source_op(state.source_op, e, machine_id=mid)
    restore = rs_.evolve_restore(state.restore, e, machine_id=mid)
    collection = None if state.collection is None else gc_.evolve_collection(
        state.collection, e, machine_id=mid)
    # An event moves at most one step; copy the 21-field state only when one did.
    if (capture is not state.capture or source_op is not state.source_op
            or restore is not state.restore or collection is not state.collection):
        state = replace(state, capture=capture, source_op=source_op, restore=restore,
                        collection=collection)
    return _evolve_steps(state, e)


def _evolve_own(state: MigrationState, e: DomainEvent) -> MigrationState:
    if isinstance(e, SourceVanished) and state.target_ran:
        return replace(state, source_gone=True)  # lazy: its pages had all gone, or lost
    match e:
        case Retargeted(wake_in_place=True):
            return replace(state, target=e.node, status=MigrationPhase.WAKING_IN_PLACE)
        case Retargeted() if state.status is MigrationPhase.ROLLING_BACK:
            return replace(state, target=e.node, status=MigrationPhase.RESTORING)
        case Retargeted():
            return replace(state, target=e.node)
        case MigrationCancelRequested(before_deletion=True):
            return replace(state, cancelled=True, status=MigrationPhase.WAKING_IN_PLACE)
        case MigrationCancelRequested():
            return replace(state, cancelled=True, target=state.spec.source_node)
        case SourceDeletionAborted() if _restored(state):
            # A streamed target runs verified: never wake the source beside it.
            return replace(state, abort=Failure(e.reason, e.message))
        case SourceDeletionAborted():
            return replace(state, status=MigrationPhase.WAKING_IN_PLACE,
                           abort=Failure(e.reason, e.message))
        case SourceVanished() if state.status is MigrationPhase.ADOPTING or _restored(state):
            return _collecting(replace(state, source_gone=True), e.at)
        case SourceVanished():
            return replace(state, source_gone=True, status=MigrationPhase.RESTORING,
                           target=e.target or state.target, restore_due_at=_due(state, e.at))
        case RollbackStarted():
            return replace(state, rollback=True, target=state.spec.source_node,
                           status=MigrationPhase.ROLLING_BACK)
        case AdoptionRequested(attempt=1):
            assert e.deadline is not None
            return replace(state, adoption=Adoption(requested_at=e.at, deadline=e.deadline))
        case AdoptionRequested() if state.adoption is not None:
            return replace(state, adoption=replace(state.adoption, requested_at=e.at,
                                                   attempt=e.attempt))
        case Adopted() if state.adoption is not None:
            return replace(state, adoption=replace(state.adoption, owner=e.owner))
        case AdoptionAbandoned() | HandoffAbandoned():
            return replace(state, status=MigrationPhase.WAKING_IN_PLACE,
                           abort=Failure(e.reason, e.message))
        case StreamDeclined():
            return replace(state, stream_declined=e.reason)
        case PagesTransferred() if state.status is MigrationPhase.TARGET_RUNNING:
            return replace(state, status=MigrationPhase.DELETING_SOURCE)
        case WorkloadLost():
            return replace(state, status=MigrationPhase.CLEARING_LOST,
                           failure=Failure(e.reason, e.message), final_node=None)
    return state


def _restored(state: MigrationState) -> bool:
    """A streamed migration's target runs verified; only the source is left to go."""
    return state.status is MigrationPhase.DELETING_SOURCE and state.restore is not None \
        and state.restore.status is rs_.RestoreStatus.VERIFIED


def _evolve_steps(state: MigrationState, e: DomainEvent) -> MigrationState:
    if state.spec.lazy:
        lazy = _evolve_lazy(state, e)
        if lazy is not None:
            return lazy
    match e:
        case ArtifactVerified() if state.status is MigrationPhase.CHECKPOINTING:
            # Adoption restores beside the (quiesced) source; a bare pod's goes first.
            after = MigrationPhase.RESTORING if state.beside_source else \
                MigrationPhase.DELETING_SOURCE
            return replace(state, status=after, verified_at=e.at)
        case CaptureFailed() if state.status is MigrationPhase.CHECKPOINTING:
            return replace(state, status=MigrationPhase.UNSTICKING,
                           failure=state.capture.failure)
        case SourceDeletionRequested():
            return replace(state, deletion_requested=True)
        case SourceDeleted() if state.status is MigrationPhase.ADOPTING or _restored(state):
            return _collecting(replace(state, source_gone=True), e.at)
        case SourceDeleted() if state.status is MigrationPhase.DELETING_SOURCE:
            return replace(state, source_gone=True, status=MigrationPhase.RESTORING,
                           restore_due_at=_due(state, e.at))
        case RestoreCleanedUp() if state.spec.keep_name:
            return replace(state, restore_due_at=e.at)
        case SourceDeletionFailed() if state.source_op is not None and \
                state.status is MigrationPhase.DELETING_SOURCE and not _restored(state):
            return replace(state, status=MigrationPhase.WAKING_IN_PLACE,
                           abort=state.source_op.failure)
        case RestorePodRequested(plan=RestorePlan()):
            return replace(state, attempts=state.attempts + 1)
        case RestoreFailed() if state.restore is not None and not state.restore.superseded:
            return replace(state, failures=state.failures + 1)
        case RestoreVerified() if state.restore is not None:
            final = state.restore.node or state.restore.plan.node
            if state.spec.adopts and not state.source_gone:
                return replace(state, status=MigrationPhase.ADOPTING, final_node=final)
            if state.streams and not state.source_gone:
                # The target runs what the registry holds: now the source may go.
                return replace(state, status=MigrationPhase.DELETING_SOURCE,
                               final_node=final)
            return _collecting(replace(state, final_node=final), e.at)
        case ArtifactDeletionFailed() if state.collection is not None:
            return replace(state, conditions=set_condition(state.conditions, Condition(
                GC_CONDITION, e.error_class, e.message, e.at)))
        case ArtifactDeleted():
            return replace(state, conditions=clear_condition(state.conditions, GC_CONDITION))
    return state


def _evolve_lazy(state: MigrationState, e: DomainEvent) -> MigrationState | None:
    """A lazy migration's own transitions (``None``: the shared ones apply)."""
    match e:
        case RestoreVerified() if state.status is MigrationPhase.CHECKPOINTING and \
                state.restore is not None:
            # The target runs (its pages on their way): the transfer deadline starts.
            deadline = e.at + seconds(state.klass.timeouts.restore)
            return replace(state, status=MigrationPhase.TARGET_RUNNING,
                           final_node=state.restore.node or state.restore.plan.node,
                           transfer_deadline=deadline)
        case SourceDeleted() if state.target_ran:
            return replace(state, source_gone=True)
        case SourceDeletionFailed() if state.target_ran:
            return state  # never woken: the decision ends it (the op holds the failure)
    return None


def _collecting(state: MigrationState, at: datetime) -> MigrationState:
    """The workload runs restored: collect the artifact (gate 2)."""
    pinned = state.pinned  # parses the artifact reference: once
    assert pinned is not None
    deadline = at + seconds(state.klass.timeouts.gc)
    return replace(state, status=MigrationPhase.COLLECTING_GARBAGE,
                   collection=Collection(pinned=pinned, deadline=deadline))


def _due(state: MigrationState, at: datetime) -> datetime | None:
    """Only a kept name waits, so only then is the moment recorded (an older history
    folds to the state it always had)."""
    return at if state.spec.keep_name else None
