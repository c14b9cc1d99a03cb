"""The ``restore`` machine: create a pod from a checkpoint artifact on a target node.

Phases::

    Resolving --ArtifactResolved--> Restoring --RestoreVerified--> Succeeded
    Resolving --(artifact absent / wrong provenance / deadline)--> Failed
    Restoring --RestoreFailed--> CleaningUp --RestoreCleanedUp--> Failed | Cancelled

``Resolving`` proves the artifact exists (``registry/repo@digest``, with this checkpoint's
provenance when ``checkpoint_id`` is given) before a pod is created; a probe error waits.
``Restoring`` creates the pod with REQUIRED node affinity to ``node`` and the restore
annotation; it succeeds only when the pod runs and the agent reports a fresh instance
restored from exactly that digest. An unschedulable target is reported
(``TargetUnschedulable``) and fails at the scheduling deadline.

Spec: ``artifact`` (``registry/repo@sha256:...``), ``namespace``, ``name`` (of the new
pod), ``node``, ``template`` (the saved pod), optional ``checkpoint_id``, ``source_uid``,
``source_instance`` (an instance id that does not count as fresh), ``class``.
Commands: ``Cancel``. Registered by :func:`controlplane.machines.catalog.product_kinds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.commands import CommandSet
from controlplane.engine.decider import (
    CommandLike,
    CommandRejected,
    Decision,
    Event,
    EventLike,
    InvalidSpec,
)
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, ProbeError, TagView
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
from controlplane.machines.base.facts import tag_facts, with_facts
from controlplane.machines.base.failures import Failure
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.refs import parse_digest_ref
from controlplane.machines.base.specs import (
    checkpoint_class,
    class_json,
    namespace_name,
    node_name,
    object_name,
    only_known,
    pod_template,
    require,
)
from controlplane.machines.base.states import PhasedState
from controlplane.machines.base.stepping import Step, finish, started, wait
from controlplane.machines.base.timing import next_poll, seconds
from controlplane.machines.config.classes import CheckpointClass
from controlplane.machines.contract import protocol
from controlplane.machines.stages import restore as rs_
from controlplane.machines.stages.restore import (
    RESTORE_EVENTS,
    Restore,
    RestoreContext,
    RestoreFailed,
    RestorePlan,
    RestoreStatus,
    RestoreVerified,
)

KIND = "restore"


@dataclass(frozen=True)
class ArtifactResolved(DomainEvent):
    """The artifact's reference resolved to this digest, with the expected provenance."""

    at: datetime
    digest: str


@dataclass(frozen=True)
class RestoreFinished(Finished):
    pass


RESTORE_KIND_EVENTS = EventSet(
    ENGINE_EVENTS, (Started, ArtifactResolved, RestoreFinished, CancelRequested),
    RESTORE_EVENTS)
_NOT_OBSERVED = ProbeError("NotObserved", "the artifact was not observed")


class RestorePhase(StrEnum):
    RESOLVING = "Resolving"
    RESTORING = "Restoring"
    CLEANING_UP = "CleaningUp"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({RestorePhase.SUCCEEDED, RestorePhase.FAILED, RestorePhase.CANCELLED})


@dataclass(frozen=True)
class RestoreSpec:
    artifact: str  # registry/repo@sha256:...
    namespace: str
    name: str
    node: str
    template: RawJson
    checkpoint_id: str | None
    source_uid: str | None
    source_instance: str | None


@dataclass(frozen=True)
class RestoreState(PhasedState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: RestoreSpec
    klass: CheckpointClass
    status: RestorePhase = RestorePhase.RESOLVING
    started_at: datetime | None = None
    restore: Restore | None = None
    cancelled: bool = False
    failure: Failure | None = None
    instance_id: str | None = None


    @property
    def wake_keys(self) -> frozenset[str]:
        if self.terminal or self.restore is None:
            return frozenset()
        keys = {self.restore.plan.key}
        if self.restore.uid:
            keys.add(self.restore.uid)
        return frozenset(keys)

    def context(self) -> RestoreContext:
        t = self.klass.timeouts
        return RestoreContext(template=self.spec.template,
                              loader=self.klass.loader_annotation(),
                              unseal=self.klass.unseal_annotation(),
                              schedule_timeout=t.schedule, restore_timeout=t.restore,
                              cleanup_timeout=t.release)



def _opt_str(spec: JsonObject, key: str) -> str | None:
    value = spec.get(key)
    return value if isinstance(value, str) and value else None


#: The commands a restore machine accepts.
_COMMANDS = CommandSet("restore", Cancel)


class RestoreDecider:
    """The ``restore`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("artifact", "namespace", "name", "node", "template", "checkpoint_id",
                          "source_uid", "source_instance", "class"))
        out: JsonObject = {
            "artifact": str(parse_digest_ref(require(spec, "artifact"),
                                             field="spec.artifact")),
            "namespace": namespace_name(require(spec, "namespace"), field="spec.namespace"),
            "name": object_name(require(spec, "name"), field="spec.name"),
            "node": node_name(require(spec, "node"), field="spec.node"),
            "template": pod_template(require(spec, "template"), field="spec.template"),
            "class": class_json(spec.get("class")),
        }
        for key in ("checkpoint_id", "source_uid", "source_instance"):
            value = spec.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSpec(f"spec.{key} must be a non-empty string when given")
            out[key] = value
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> RestoreState:
        template = spec["template"]
        assert isinstance(template, dict)
        ref = parse_digest_ref(spec["artifact"], field="spec.artifact")
        assert ref.digest is not None
        rspec = RestoreSpec(
            artifact=ref.pinned(ref.digest), namespace=str(spec["namespace"]),
            name=str(spec["name"]), node=str(spec["node"]), template=template,
            checkpoint_id=_opt_str(spec, "checkpoint_id"),
            source_uid=_opt_str(spec, "source_uid"),
            source_instance=_opt_str(spec, "source_instance"))
        return RestoreState(machine_id, rspec, checkpoint_class(spec.get("class")))

    def interests(self, state: RestoreState) -> Interests:
        if state.terminal:
            return Interests()
        if state.restore is None:  # the node's runtime decides how it restores
            return Interests(tags=frozenset({state.spec.artifact}),
                             nodes=frozenset({state.spec.node}))
        plan = state.restore.plan
        nodes = frozenset({plan.node}) if plan.node and state.restore.in_flight else frozenset()
        return Interests(pods=frozenset({plan.key}), nodes=nodes)

    def decide(self, state: RestoreState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            return started(self, state, Started(at=now, kind=KIND), observation, now)
        return with_facts(self._step(state, observation, now).decision(), observation)

    def _step(self, state: RestoreState, obs: Observation, now: datetime) -> Step:
        assert state.started_at is not None
        mid = state.machine_id
        r = state.restore
        if state.status is RestorePhase.RESOLVING:
            return self._resolve(state, obs, now)
        assert r is not None
        if state.cancelled and r.in_flight:
            return rs_.abandon_restore(r, now, "cancelled by the operator")
        if r.status is RestoreStatus.VERIFIED:
            return _finish(state, now, RestorePhase.SUCCEEDED, "Verified",
                           f"restored on {r.plan.node} as instance {r.instance_id}")
        if r.status is RestoreStatus.CLEANED:
            assert r.failure is not None
            end = RestorePhase.CANCELLED if state.cancelled else RestorePhase.FAILED
            return _finish(state, now, end, r.failure.reason, r.failure.message)
        return rs_.decide_restore(r, state.context(), obs, now, machine_id=mid)

    def _resolve(self, state: RestoreState, obs: Observation, now: datetime) -> Step:
        assert state.started_at is not None
        spec = state.spec
        if state.cancelled:
            return _finish(state, now, RestorePhase.CANCELLED, "Cancelled",
                           "cancelled by the operator")
        tag = obs.tags.get(spec.artifact, _NOT_OBSERVED)
        facts = tag_facts(spec.artifact, tag)
        deadline = state.started_at + seconds(state.klass.timeouts.resolve)
        if isinstance(tag, ProbeError):
            if now >= deadline:
                return _finish(state, now, RestorePhase.FAILED, "RegistryUnavailable",
                               f"artifact {spec.artifact} could not be probed: {tag.message}",
                               facts)
            return wait(deadline, next_poll(state.started_at, now))
        if tag is None:
            return _finish(state, now, RestorePhase.FAILED, "ArtifactMissing",
                           f"artifact {spec.artifact} does not exist", facts)
        problem = _provenance(spec, tag)
        if problem is not None:
            return _finish(state, now, RestorePhase.FAILED, "ArtifactProvenance", problem, facts)
        plan = RestorePlan(attempt=1, namespace=spec.namespace, pod_name=spec.name,
                           node=spec.node, artifact=spec.artifact,
                           checkpoint_id=spec.checkpoint_id,
                           not_fresh=(spec.source_instance,) if spec.source_instance else ())
        planned = rs_.runtime_plan(plan, obs, now, state.klass.runtime_paths())
        if isinstance(planned, Step):
            return planned
        resolved = ArtifactResolved(at=now, digest=tag.digest).recorded(facts)
        start = rs_.start_restore(planned, state.context(), now, machine_id=state.machine_id)
        return Step(events=(resolved, *start.events), actions=start.actions,
                    confirm=start.confirm)

    def evolve(self, state: RestoreState, event: EventLike | DomainEvent) -> RestoreState:
        e = RESTORE_KIND_EVENTS.decode(event)
        if state.terminal:
            return state
        match e:
            case Started():
                return replace(state, started_at=e.at)
            case RestoreFinished():
                failure = None if e.phase == RestorePhase.SUCCEEDED.value else Failure(
                    e.reason, e.message)
                return replace(state, status=RestorePhase(e.phase), failure=failure)
            case CancelRequested():
                return replace(state, cancelled=True)
            case ArtifactResolved():
                return replace(state, status=RestorePhase.RESTORING)
        restore = rs_.evolve_restore(state.restore, e, machine_id=state.machine_id)
        if restore is not state.restore:
            state = replace(state, restore=restore)
        if isinstance(e, RestoreVerified) and restore is not None:
            return replace(state, instance_id=restore.instance_id)
        if isinstance(e, RestoreFailed) and restore is not None:
            return replace(state, status=RestorePhase.CLEANING_UP, failure=restore.failure)
        return state

    def accept(self, state: RestoreState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        _COMMANDS.decode(command)  # Cancel: the only one
        if state.terminal:
            raise CommandRejected(f"restore {state.machine_id} is already {state.phase}")
        if state.cancelled:
            return ()
        return (CancelRequested(at=now).recorded({"command": "Cancel"}),)

    def load_state(self, data: JsonObject) -> RestoreState:
        return decode(RestoreState, data)


def _provenance(spec: RestoreSpec, tag: TagView) -> str | None:
    if not spec.artifact.endswith("@" + tag.digest):
        return f"the registry resolved {spec.artifact} to another digest {tag.digest}"
    if spec.checkpoint_id is None:
        return None
    seen = tag.annotations.get(protocol.MANIFEST_CHECKPOINT_ID)
    if seen != spec.checkpoint_id:
        return f"manifest names checkpoint {seen!r}, not {spec.checkpoint_id!r}"
    seen_uid = tag.annotations.get(protocol.MANIFEST_SOURCE_POD_UID)
    if spec.source_uid is not None and seen_uid != spec.source_uid:
        return f"manifest names source pod uid {seen_uid!r}, not {spec.source_uid!r}"
    return None


def _finish(state: RestoreState, now: datetime, phase: RestorePhase, reason: str,
            message: str, facts: JsonObject | None = None) -> Step:
    """The terminal event, and a Kubernetes Event on the restored pod's name."""
    spec = state.spec
    return finish(RestoreFinished(at=now, phase=phase.value, reason=reason,
                                  message=message).recorded(facts),
                  machine_id=state.machine_id, namespace=spec.namespace, pod_name=spec.name,
                  pod_uid=None, warning=phase is RestorePhase.FAILED,
                  reason=f"Restore{phase.value}",
                  message=f"{reason}: {message} (operation {state.machine_id})")
