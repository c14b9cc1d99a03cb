"""The ``suspend`` machine: checkpoint a pod (quiesced), then delete it, keeping its spec.

Phases::

    Checkpointing --ArtifactVerified--> DeletingSource --SourceDeleted|SourceVanished-->
        Suspended (terminal: ``artifact`` pinned by digest, ``template`` kept)
    Checkpointing --CaptureFailed--> Unsticking --> Failed
    Checkpointing/DeletingSource --Cancel | SourceDeletionAborted--> WakingInPlace
        --SourceReleased--> Cancelled | Failed

The source is deleted under the same guard as a migration's
(:func:`controlplane.machines.stages.source.decide_deletion`). The terminal state is what a
later ``resume`` needs: the submitter passes ``artifact`` (and ``checkpoint_id``,
``source_uid``) of the latest ``Suspended`` machine as the resume's first candidate, with
``template``. Resume lives in :mod:`controlplane.machines.resume.machine`.

Spec: ``pod`` ``{namespace, name, uid}``, ``template`` (the saved pod), optional
``artifact``, ``containers``, ``class``. Commands: ``Cancel`` (before the delete).
Registered by :func:`controlplane.machines.catalog.product_kinds`. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.commands import CommandSet
from controlplane.engine.decider import CommandLike, CommandRejected, Decision, Event, EventLike
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation
from controlplane.machines.base.codec import RawJson, decode
from controlplane.machines.base.commands import Cancel
from controlplane.machines.base.events import (
    ENGINE_EVENTS,
    CancelRequested,
    DomainEvent,
    EventSet,
    Finished,
    Started,
)
from controlplane.machines.base.facts import with_facts
from controlplane.machines.base.failures import Failure
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.specs import checkpoint_class, only_known, pod_template, require
from controlplane.machines.base.states import CapturingState
from controlplane.machines.base.stepping import Step, finish, started
from controlplane.machines.checkpoint.machine import capture_spec, validate_capture_fields
from controlplane.machines.config.classes import CheckpointClass, OnFailure
from controlplane.machines.stages import capture as cap_
from controlplane.machines.stages import source as src_
from controlplane.machines.stages.capture import (
    CAPTURE_EVENTS,
    ArtifactVerified,
    Capture,
    CaptureFailed,
    CaptureSpec,
    CaptureStatus,
)
from controlplane.machines.stages.source import (
    SOURCE_EVENTS,
    SourceDeletionAborted,
    SourceDeletionFailed,
    SourceDeletionRequested,
    SourceOp,
    SourceVanished,
)

KIND = "suspend"


@dataclass(frozen=True)
class SuspendFinished(Finished):
    """How the suspend ended; ``artifact`` is the checkpoint to resume from (``null``
    when none was verified)."""

    artifact: str | None


SUSPEND_EVENTS = EventSet(ENGINE_EVENTS, (Started, SuspendFinished, CancelRequested),
                          CAPTURE_EVENTS, SOURCE_EVENTS)


class SuspendPhase(StrEnum):
    CHECKPOINTING = "Checkpointing"
    DELETING_SOURCE = "DeletingSource"
    UNSTICKING = "Unsticking"
    WAKING_IN_PLACE = "WakingInPlace"
    SUSPENDED = "Suspended"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({SuspendPhase.SUSPENDED, SuspendPhase.FAILED, SuspendPhase.CANCELLED})


@dataclass(frozen=True)
class SuspendState(CapturingState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: CaptureSpec
    template: RawJson
    klass: CheckpointClass
    status: SuspendPhase = SuspendPhase.CHECKPOINTING
    started_at: datetime | None = None
    capture: Capture = field(default_factory=Capture)
    verified_at: datetime | None = None
    source_op: SourceOp | None = None
    deletion_requested: bool = False
    cancelled: bool = False
    abort: Failure | None = None
    failure: Failure | None = None
    artifact: str | None = None  # registry/repo@sha256:..., once verified





#: The commands a suspend machine accepts.
_COMMANDS = CommandSet("suspend", Cancel)


class SuspendDecider:
    """The ``suspend`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("pod", "template", "artifact", "containers", "class"))
        out = validate_capture_fields(spec)
        out["template"] = pod_template(require(spec, "template"), field="spec.template")
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> SuspendState:
        klass = checkpoint_class(spec.get("class"))
        template = spec["template"]
        assert isinstance(template, dict)
        return SuspendState(machine_id, capture_spec(machine_id, spec, klass, quiesce=True),
                            template, klass)

    def interests(self, state: SuspendState) -> Interests:
        if state.terminal:
            return Interests()
        pods = frozenset({state.spec.pod_key})
        return Interests(pods=pods)  # the registry: when a decision needs it (needs_tags)

    def decide(self, state: SuspendState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            return started(self, state, Started(at=now, kind=KIND), observation, now)
        return with_facts(self._step(state, observation, now).decision(), observation)

    def _step(self, state: SuspendState, obs: Observation, now: datetime) -> Step:
        assert state.started_at is not None
        mid, s = state.machine_id, state.status
        if s is SuspendPhase.CHECKPOINTING:
            return cap_.decide_capture(state.spec, state.capture, obs, now, machine_id=mid,
                                       started_at=state.started_at)
        if s is SuspendPhase.DELETING_SOURCE:
            assert state.artifact is not None
            assert state.verified_at is not None
            op = state.source_op if state.deletion_requested else None
            if op is not None and op.status is src_.SourceOpStatus.DONE:
                return self._suspended(state, now, f"pod deleted ({op.outcome})")
            return src_.decide_deletion(op, state.source, state.artifact, obs, now,
                                        machine_id=mid, verified_at=state.verified_at,
                                        timeout=state.klass.timeouts.delete)
        kill = s is SuspendPhase.UNSTICKING and state.klass.on_failure is OnFailure.KILL
        since = state.capture.failed_at or state.started_at
        result = src_.decide_unstick(
            state.source_op, state.source, obs, now, machine_id=mid,
            kill=kill, timeout=state.klass.timeouts.release, since=since,
            reason="capture failed" if s is SuspendPhase.UNSTICKING else "wake in place")
        if isinstance(result, Step):
            return result
        return self._after_unstick(state, now, result)

    def _after_unstick(self, state: SuspendState, now: datetime, result: src_.Unstuck) -> Step:
        note = f"; source NOT unstuck: {result.note}" if result.note else ""
        if state.status is SuspendPhase.UNSTICKING:
            assert state.failure is not None
            return _finish(state, now, SuspendPhase.FAILED, state.failure.reason,
                           state.failure.message + note)
        if result.how in ("pod-gone", "pod-terminating"):
            if state.capture.status is CaptureStatus.VERIFIED:
                return self._suspended(state, now, "the pod went away; its state is in the "
                                                   "verified artifact")
            return _finish(state, now, SuspendPhase.FAILED, "SourceGone",
                           "the pod went away before its state was captured")
        if result.note:
            return _finish(state, now, SuspendPhase.FAILED, "WakeInPlaceFailed",
                           f"the workload may still be stopped{note}")
        if state.abort is not None:
            return _finish(state, now, SuspendPhase.FAILED, state.abort.reason,
                           f"{state.abort.message}; workload resumed in place")
        return _finish(state, now, SuspendPhase.CANCELLED, "Cancelled",
                       "workload resumed in place")

    def _suspended(self, state: SuspendState, now: datetime, how: str) -> Step:
        return _finish(state, now, SuspendPhase.SUSPENDED, "Suspended",
                       f"{how}; resume from {state.artifact}")

    def evolve(self, state: SuspendState, event: EventLike | DomainEvent) -> SuspendState:
        e = SUSPEND_EVENTS.decode(event)
        if state.terminal:
            return state
        match e:
            case Started():
                return replace(state, started_at=e.at)
            case SuspendFinished():
                phase = SuspendPhase(e.phase)
                failure = Failure(e.reason, e.message) \
                    if phase is SuspendPhase.FAILED else state.failure
                return replace(state, status=phase, failure=failure)
            case CancelRequested():
                return replace(state, cancelled=True, status=SuspendPhase.WAKING_IN_PLACE)
            case SourceDeletionAborted():
                return replace(state, status=SuspendPhase.WAKING_IN_PLACE,
                               abort=Failure(e.reason, e.message))
            case SourceVanished():
                return replace(state, source_op=src_.SourceOp(
                    src_.SourceOpKind.DELETE, src_.SourceOpStatus.DONE, outcome="pod-gone"),
                    deletion_requested=True)
        mid = state.machine_id
        capture = cap_.evolve_capture(state.capture, e, machine_id=mid)
        op = src_.evolve_source_op(state.source_op, e, machine_id=mid)
        if capture is not state.capture or op is not state.source_op:
            state = replace(state, capture=capture, source_op=op)
        match e:
            case ArtifactVerified() if state.status is SuspendPhase.CHECKPOINTING:
                return replace(state, status=SuspendPhase.DELETING_SOURCE, verified_at=e.at,
                               artifact=e.pinned)
            case CaptureFailed() if state.status is SuspendPhase.CHECKPOINTING:
                return replace(state, status=SuspendPhase.UNSTICKING, failure=capture.failure)
            case SourceDeletionRequested():
                return replace(state, deletion_requested=True)
            case SourceDeletionFailed() if op is not None:
                return replace(state, status=SuspendPhase.WAKING_IN_PLACE, abort=op.failure)
        return state

    def accept(self, state: SuspendState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        _COMMANDS.decode(command)  # Cancel: the only one
        if state.terminal:
            raise CommandRejected(f"suspend {state.machine_id} is already {state.phase}")
        if state.cancelled or state.status in (SuspendPhase.UNSTICKING,
                                               SuspendPhase.WAKING_IN_PLACE):
            return ()
        if state.deletion_requested:
            raise CommandRejected(f"suspend {state.machine_id} already deleted the pod; its "
                                  f"state is in {state.artifact}: submit a resume instead")
        return (CancelRequested(at=now).recorded({"command": "Cancel"}),)

    def load_state(self, data: JsonObject) -> SuspendState:
        return decode(SuspendState, data)


def _finish(state: SuspendState, now: datetime, phase: SuspendPhase, reason: str,
            message: str) -> Step:
    s = state.spec
    return finish(SuspendFinished(at=now, phase=phase.value, reason=reason, message=message,
                                  artifact=state.artifact).recorded(),
                  machine_id=state.machine_id, namespace=s.namespace, pod_name=s.name,
                  pod_uid=s.uid, warning=phase is SuspendPhase.FAILED,
                  reason=f"Suspend{phase.value}", message=f"{reason}: {message}")
