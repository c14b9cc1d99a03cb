"""The ``checkpoint`` machine: capture one pod into an OCI artifact and prove it.

Phases::

    Requested --CaptureReported--> Captured
    Requested/Captured --ArtifactVerified--> Verified
        Verified --(quiesce: leave the workload stopped)--> Succeeded
        Verified --ReleaseRequested .. SourceReleased--> Succeeded
    Requested/Captured --CaptureFailed | CancelRequested--> Unsticking
        Unsticking --Release or Kill (per class) .. observed--> Failed | Cancelled

The machine id is the checkpoint id. Spec: ``pod`` ``{namespace, name, uid}`` (uid as
observed at submission), ``artifact`` (tag reference; default from the class tag scheme),
``containers`` (default: all), ``quiesce`` (default false), ``class`` (the resolved
checkpoint class, see :mod:`controlplane.machines.config.classes`). Commands: ``Cancel``.

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
from controlplane.machines.base.codec import decode
from controlplane.machines.base.commands import Cancel
from controlplane.machines.base.events import (
    ENGINE_EVENTS,
    CancelRequested,
    DomainEvent,
    EventSet,
    Finished,
    Started,
)
from controlplane.machines.base.facts import pod_facts, with_facts
from controlplane.machines.base.failures import Condition, Failure, set_condition
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.refs import parse_tag_ref
from controlplane.machines.base.specs import (
    checkpoint_class,
    class_json,
    containers,
    flag,
    only_known,
    pod_ref,
    require,
)
from controlplane.machines.base.states import CapturingState
from controlplane.machines.base.stepping import Step, finish, started
from controlplane.machines.config.classes import CheckpointClass, OnFailure, artifact_for
from controlplane.machines.stages import capture as cap_
from controlplane.machines.stages import source as src_
from controlplane.machines.stages.capture import (
    CAPTURE_EVENTS,
    ArtifactVerified,
    Capture,
    CaptureFailed,
    CaptureReported,
    CaptureSpec,
    CaptureStatus,
)
from controlplane.machines.stages.source import (
    SOURCE_EVENTS,
    SourceOp,
    SourceOpFailed,
    SourceOpKind,
    SourceOpStatus,
)

KIND = "checkpoint"


@dataclass(frozen=True)
class CheckpointFinished(Finished):
    pass


CHECKPOINT_EVENTS = EventSet(ENGINE_EVENTS, (Started, CheckpointFinished, CancelRequested),
                             CAPTURE_EVENTS, SOURCE_EVENTS)


class CheckpointPhase(StrEnum):
    REQUESTED = "Requested"
    CAPTURED = "Captured"
    VERIFIED = "Verified"
    UNSTICKING = "Unsticking"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({CheckpointPhase.SUCCEEDED, CheckpointPhase.FAILED,
                      CheckpointPhase.CANCELLED})


@dataclass(frozen=True)
class CheckpointState(CapturingState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: CaptureSpec
    klass: CheckpointClass
    status: CheckpointPhase = CheckpointPhase.REQUESTED
    started_at: datetime | None = None
    capture: Capture = field(default_factory=Capture)
    source_op: SourceOp | None = None
    cancelled: bool = False
    failed_at: datetime | None = None
    failure: Failure | None = None
    conditions: tuple[Condition, ...] = ()
    artifact: str | None = None  # registry/repo@sha256:... once verified





def capture_spec(machine_id: str, spec: JsonObject, klass: CheckpointClass,
                 *, quiesce: bool) -> CaptureSpec:
    """The capture step's spec from a (validated) machine spec; shared with other kinds."""
    pod = pod_ref(spec.get("pod"))
    artifact = spec.get("artifact")
    if not isinstance(artifact, str):
        artifact = artifact_for(klass, checkpoint_id=machine_id, namespace=pod.namespace,
                                pod=pod.name)
    return CaptureSpec(
        checkpoint_id=machine_id, namespace=pod.namespace, name=pod.name, uid=pod.uid,
        artifact=artifact, containers=containers(spec.get("containers"), field="containers"),
        quiesce=quiesce, saver=klass.saver_annotation(),
        timeout=klass.timeouts.capture, seal=klass.seal_annotation())


def validate_capture_fields(spec: JsonObject) -> JsonObject:
    """Normalise the fields every capturing kind shares (pod, artifact, containers, class)."""
    pod = pod_ref(require(spec, "pod"))
    artifact = spec.get("artifact")
    if artifact is not None:
        artifact = str(parse_tag_ref(artifact, field="spec.artifact"))
    return {"pod": pod.to_json(), "artifact": artifact,
            "containers": list(containers(spec.get("containers"), field="spec.containers")),
            "class": class_json(spec.get("class"))}


#: The commands a checkpoint machine accepts.
_COMMANDS = CommandSet("checkpoint", Cancel)


class CheckpointDecider:
    """The ``checkpoint`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("pod", "artifact", "containers", "quiesce", "class"))
        out = validate_capture_fields(spec)
        out["quiesce"] = flag(spec.get("quiesce"), field="spec.quiesce", default=False)
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> CheckpointState:
        klass = checkpoint_class(spec.get("class"))
        quiesce = flag(spec.get("quiesce"), field="spec.quiesce", default=False)
        return CheckpointState(machine_id, capture_spec(machine_id, spec, klass, quiesce=quiesce),
                               klass)

    def interests(self, state: CheckpointState) -> Interests:
        if state.terminal:
            return Interests()
        # The artifact's tag: when the capture's decision needs it (needs_tags).
        return Interests(pods=frozenset({state.spec.pod_key}))

    def decide(self, state: CheckpointState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            return started(self, state, Started(at=now, kind=KIND), observation, now,
                           facts=pod_facts(state.spec.pod_key,
                                           observation.pods.get(state.spec.pod_key)))
        return with_facts(self._step(state, observation, now).decision(), observation)

    def _step(self, state: CheckpointState, obs: Observation, now: datetime) -> Step:
        assert state.started_at is not None
        mid = state.machine_id
        if state.status in (CheckpointPhase.REQUESTED, CheckpointPhase.CAPTURED):
            return cap_.decide_capture(state.spec, state.capture, obs, now, machine_id=mid,
                                       started_at=state.started_at)
        if state.status is CheckpointPhase.VERIFIED:
            if state.spec.quiesce:
                return _finish(state, now, CheckpointPhase.SUCCEEDED, "Verified",
                               "artifact verified; workload left stopped (quiesce)")
            return self._release_then_succeed(state, obs, now)
        return self._unstick(state, obs, now)

    def _release_then_succeed(self, state: CheckpointState, obs: Observation,
                              now: datetime) -> Step:
        op = state.source_op
        if op is None:
            return src_.start_source_op(SourceOpKind.RELEASE, state.source, obs, now,
                                        machine_id=state.machine_id,
                                        timeout=state.klass.timeouts.release,
                                        reason="capture verified; withdraw the request")
        if op.status is SourceOpStatus.ISSUED:
            return src_.decide_source_op(op, state.source, obs, now,
                                         machine_id=state.machine_id)
        message = "artifact verified; capture request withdrawn"
        if op.failure is not None:
            message = f"artifact verified; request not withdrawn: {op.failure.message}"
        return _finish(state, now, CheckpointPhase.SUCCEEDED, "Verified", message)

    def _unstick(self, state: CheckpointState, obs: Observation, now: datetime) -> Step:
        assert state.failure is not None
        assert state.failed_at is not None
        end = CheckpointPhase.CANCELLED if state.cancelled else CheckpointPhase.FAILED
        if state.failure.reason == "SourceGone" and state.source_op is None:
            return _finish(state, now, end, state.failure.reason, state.failure.message)
        kill = state.klass.on_failure is OnFailure.KILL and not state.cancelled
        result = src_.decide_unstick(state.source_op, state.source, obs, now,
                                     machine_id=state.machine_id, kill=kill,
                                     timeout=state.klass.timeouts.release,
                                     since=state.failed_at,
                                     reason=f"capture {end.value.lower()}: "
                                            f"{state.failure.reason}")
        if isinstance(result, Step):
            return result
        message = state.failure.message
        if result.note:
            message += f"; source NOT unstuck: {result.note}"
        return _finish(state, now, end, state.failure.reason, message)

    def evolve(self, state: CheckpointState,
               event: EventLike | DomainEvent) -> CheckpointState:
        e = CHECKPOINT_EVENTS.decode(event)
        if state.terminal:
            return state
        match e:
            case Started():
                return replace(state, started_at=e.at)
            case CheckpointFinished():
                return replace(state, status=CheckpointPhase(e.phase))
            case CancelRequested():
                return replace(state, cancelled=True, status=CheckpointPhase.UNSTICKING,
                               failed_at=e.at,
                               failure=Failure("Cancelled", "cancelled by the operator"))
        capture = cap_.evolve_capture(state.capture, e, machine_id=state.machine_id)
        op = src_.evolve_source_op(state.source_op, e, machine_id=state.machine_id)
        if capture is not state.capture or op is not state.source_op:
            state = replace(state, capture=capture, source_op=op)
        match e:
            case CaptureReported() if state.status is CheckpointPhase.REQUESTED:
                return replace(state, status=CheckpointPhase.CAPTURED)
            case ArtifactVerified() if capture.status is CaptureStatus.VERIFIED:
                return replace(state, status=CheckpointPhase.VERIFIED, artifact=e.pinned)
            case CaptureFailed() if state.status is not CheckpointPhase.UNSTICKING:
                return replace(state, status=CheckpointPhase.UNSTICKING,
                               failure=capture.failure, failed_at=e.at)
            case SourceOpFailed() if op is not None and op.failure is not None:
                return replace(state, conditions=set_condition(state.conditions, Condition(
                    f"{op.kind.value}Failed", op.failure.reason, op.failure.message, e.at)))
        return state

    def accept(self, state: CheckpointState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        _COMMANDS.decode(command)  # Cancel: the only one
        if state.terminal:
            raise CommandRejected(f"checkpoint {state.machine_id} is already {state.phase}")
        if state.status not in (CheckpointPhase.REQUESTED, CheckpointPhase.CAPTURED):
            raise CommandRejected(f"checkpoint {state.machine_id} is {state.phase}; it is "
                                  "finishing and cannot be cancelled now")
        return (CancelRequested(at=now).recorded({"command": "Cancel"}),)

    def load_state(self, data: JsonObject) -> CheckpointState:
        return decode(CheckpointState, data)


def _finish(state: CheckpointState, now: datetime, phase: CheckpointPhase, reason: str,
            message: str) -> Step:
    """The terminal event, and a Kubernetes Event on the pod saying how it ended."""
    spec = state.spec
    return finish(CheckpointFinished(at=now, phase=phase.value, reason=reason,
                                     message=message).recorded(),
                  machine_id=state.machine_id, namespace=spec.namespace, pod_name=spec.name,
                  pod_uid=spec.uid, warning=phase is CheckpointPhase.FAILED,
                  reason=f"Checkpoint{phase.value}",
                  message=f"{reason}: {message} (operation {state.machine_id})")
