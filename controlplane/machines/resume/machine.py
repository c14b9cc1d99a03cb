"""The ``resume`` machine: bring a suspended workload back, restored or cold-booted.

Phases::

    Selecting --CheckpointSelected--> Restoring --RestoreVerified--> Resumed
    Selecting --ColdBootChosen--> ColdBooting --RestoreVerified--> Resumed
    Restoring/ColdBooting --RestoreFailed .. RestoreCleanedUp--> (retry) | Failed
    Selecting --(registry errors until the deadline)--> Failed

The submitter looks up the workload's checkpoints and passes them as ``candidates``,
newest first (each ``{artifact: registry/repo@sha256:..., checkpoint_id?, source_uid?,
source_instance?}``). ``Selecting`` probes them in order: the first one present with
matching provenance is restored (``CheckpointSelected``); an absent or foreign one is
skipped with its reason (``CandidateSkipped``). Only when every candidate is known to be
absent, or none was recorded, does it cold boot from the saved template
(``ColdBootChosen``, with the reason). A probe error never counts as absent: the machine
waits, and fails at the deadline rather than cold-boot over a checkpoint it could not see
(gate 3). A failed restore is retried (``class.restore_attempts``), never turned into a
cold boot.

Spec: ``namespace``, ``name``, ``template``, ``candidates`` (may be empty), optional
``node`` (required node affinity), ``class``. Commands: ``Cancel``.
Registered by :func:`controlplane.machines.catalog.product_kinds`. Pure.
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
from controlplane.engine.jsonvalue import JsonObject, JsonValue
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
from controlplane.machines.base.stepping import Step, emit, finish, started, wait
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
    RestorePodRequested,
    RestoreStatus,
    RestoreVerified,
)

KIND = "resume"


@dataclass(frozen=True)
class CandidateSkipped(DomainEvent):
    """Candidate ``index`` is absent or foreign, and why."""

    at: datetime
    index: int
    artifact: str
    reason: str


@dataclass(frozen=True)
class CheckpointSelected(DomainEvent):
    at: datetime
    index: int
    artifact: str
    reason: str


@dataclass(frozen=True)
class ColdBootChosen(DomainEvent):
    """No candidate can be restored: the workload boots from its template."""

    at: datetime
    reason: str


@dataclass(frozen=True)
class ResumeFinished(Finished):
    pass


RESUME_EVENTS = EventSet(
    ENGINE_EVENTS, (Started, CandidateSkipped, CheckpointSelected, ColdBootChosen,
                    ResumeFinished, CancelRequested), RESTORE_EVENTS)
_NOT_OBSERVED = ProbeError("NotObserved", "not observed")


class ResumePhase(StrEnum):
    SELECTING = "Selecting"
    RESTORING = "Restoring"
    COLD_BOOTING = "ColdBooting"
    RESUMED = "Resumed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({ResumePhase.RESUMED, ResumePhase.FAILED, ResumePhase.CANCELLED})


@dataclass(frozen=True)
class Candidate:
    artifact: str  # registry/repo@sha256:...
    checkpoint_id: str | None = None
    source_uid: str | None = None
    source_instance: str | None = None


@dataclass(frozen=True)
class ResumeSpec:
    namespace: str
    name: str
    node: str | None
    template: RawJson
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class ResumeState(PhasedState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    spec: ResumeSpec
    klass: CheckpointClass
    status: ResumePhase = ResumePhase.SELECTING
    started_at: datetime | None = None
    skipped: tuple[int, ...] = ()
    chosen: int | None = None
    restore: Restore | None = None
    attempts: int = 0
    failures: int = 0
    cancelled: bool = False
    failure: Failure | None = None
    instance_id: str | None = None


    @property
    def wake_keys(self) -> frozenset[str]:
        r = self.restore
        if self.terminal or r is None:
            return frozenset()
        return frozenset({r.plan.key, *([r.uid] if r.uid else [])})

    def context(self) -> RestoreContext:
        t = self.klass.timeouts
        return RestoreContext(template=self.spec.template,
                              loader=self.klass.loader_annotation(),
                              unseal=self.klass.unseal_annotation(),
                              schedule_timeout=t.schedule, restore_timeout=t.restore,
                              cleanup_timeout=t.release)



def _candidates(value: JsonValue) -> list[JsonValue]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidSpec("spec.candidates must be a list of checkpoints, newest first "
                          "(empty: none recorded, cold boot)")
    out: list[JsonValue] = []
    for i, item in enumerate(value):
        where = f"spec.candidates[{i}]"
        if not isinstance(item, dict):
            raise InvalidSpec(f"{where} must be an object with artifact (registry/repo@digest)")
        only_known(item, ("artifact", "checkpoint_id", "source_uid", "source_instance"),
                   field=where)
        entry: JsonObject = {"artifact": str(parse_digest_ref(require(item, "artifact",
                                                                      field=where),
                                                              field=f"{where}.artifact"))}
        for key in ("checkpoint_id", "source_uid", "source_instance"):
            v = item.get(key)
            if v is not None and (not isinstance(v, str) or not v):
                raise InvalidSpec(f"{where}.{key} must be a non-empty string when given")
            entry[key] = v
        out.append(entry)
    return out


#: The commands a resume machine accepts.
_COMMANDS = CommandSet("resume", Cancel)


class ResumeDecider:
    """The ``resume`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("namespace", "name", "node", "template", "candidates", "class"))
        node = spec.get("node")
        return {
            "namespace": namespace_name(require(spec, "namespace"), field="spec.namespace"),
            "name": object_name(require(spec, "name"), field="spec.name"),
            "node": None if node is None else node_name(node, field="spec.node"),
            "template": pod_template(require(spec, "template"), field="spec.template"),
            "candidates": _candidates(spec.get("candidates")),
            "class": class_json(spec.get("class")),
        }

    def initial_state(self, machine_id: str, spec: JsonObject) -> ResumeState:
        template, node = spec["template"], spec.get("node")
        assert isinstance(template, dict)
        rspec = ResumeSpec(
            namespace=str(spec["namespace"]), name=str(spec["name"]),
            node=node if isinstance(node, str) else None, template=template,
            candidates=tuple(decode(Candidate, c) for c in _candidates(spec.get("candidates"))))
        return ResumeState(machine_id, rspec, checkpoint_class(spec.get("class")))

    def interests(self, state: ResumeState) -> Interests:
        if state.terminal:
            return Interests()
        # The node's runtime decides how a checkpoint is restored (rs_.runtime_plan); a
        # cold boot needs no node read.
        node = frozenset({state.spec.node}) if state.spec.node else frozenset()
        if state.status is ResumePhase.SELECTING:
            tags = frozenset(c.artifact for i, c in enumerate(state.spec.candidates)
                             if i not in state.skipped)
            return Interests(tags=tags, nodes=node if tags else frozenset())
        r = state.restore
        if r is None or r.status is RestoreStatus.CLEANED:
            return Interests(nodes=node if state.chosen is not None else frozenset())
        nodes = frozenset({r.plan.node}) if r.plan.node and r.in_flight else frozenset()
        return Interests(pods=frozenset({r.plan.key}), nodes=nodes)

    def decide(self, state: ResumeState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            return started(self, state, Started(at=now, kind=KIND), observation, now)
        if state.status is ResumePhase.SELECTING:
            step = self._select(state, observation, now)
        else:
            step = self._restore(state, observation, now)
        return with_facts(step.decision(), observation)

    def _select(self, state: ResumeState, obs: Observation, now: datetime) -> Step:
        assert state.started_at is not None
        if state.cancelled:
            return _finish(state, now, ResumePhase.CANCELLED, "Cancelled",
                           "cancelled by the operator")
        deadline = state.started_at + seconds(state.klass.timeouts.resolve)
        for i, cand in enumerate(state.spec.candidates):
            if i in state.skipped:
                continue
            tag = obs.tags.get(cand.artifact, _NOT_OBSERVED)
            facts = tag_facts(cand.artifact, tag)
            if isinstance(tag, ProbeError):
                # Gate 3: an unreadable registry is not an empty one. Wait; never skip.
                if now >= deadline:
                    return _finish(state, now, ResumePhase.FAILED, "RegistryUnavailable",
                                   f"checkpoint {cand.artifact} could not be probed "
                                   f"({tag.error_class}: {tag.message}); not cold-booting "
                                   "over it", facts)
                return wait(deadline, next_poll(state.started_at, now))
            problem = "absent" if tag is None else _problem(cand, tag)
            if problem is not None:
                return emit(CandidateSkipped(at=now, index=i, artifact=cand.artifact,
                                             reason=problem).recorded(facts))
            selected = CheckpointSelected(
                at=now, index=i, artifact=cand.artifact,
                reason="newest candidate present with matching provenance").recorded(facts)
            start = self._start(state, obs, now, cand)
            if not start.events:  # the node's runtime is not known yet
                return start
            return Step(events=(selected, *start.events), actions=start.actions,
                        confirm=start.confirm)
        reason = ("no checkpoint was recorded for this workload" if not state.spec.candidates
                  else f"all {len(state.spec.candidates)} recorded checkpoint(s) are absent or "
                       "foreign (see CandidateSkipped)")
        chosen = ColdBootChosen(at=now, reason=reason).recorded()
        start = self._start(state, obs, now, None)
        return emit(chosen, *start.events, actions=start.actions)

    def _start(self, state: ResumeState, obs: Observation, now: datetime,
               cand: Candidate | None) -> Step:
        attempt = state.attempts + 1
        name = state.spec.name if attempt == 1 else rs_.restore_pod_name(
            state.spec.name, state.machine_id, attempt)
        plan = RestorePlan(
            attempt=attempt, namespace=state.spec.namespace, pod_name=name,
            node=state.spec.node, artifact=None if cand is None else cand.artifact,
            checkpoint_id=None if cand is None else cand.checkpoint_id,
            not_fresh=(cand.source_instance,) if cand and cand.source_instance else ())
        planned = rs_.runtime_plan(plan, obs, now, state.klass.runtime_paths())
        if isinstance(planned, Step):
            return planned
        return rs_.start_restore(planned, state.context(), now, machine_id=state.machine_id)

    def _restore(self, state: ResumeState, obs: Observation, now: datetime) -> Step:
        r = state.restore
        assert r is not None
        if state.cancelled and r.in_flight:
            return rs_.abandon_restore(r, now, "cancelled by the operator")
        if r.status is RestoreStatus.VERIFIED:
            how = "cold-booted" if r.plan.artifact is None else f"restored from {r.plan.artifact}"
            return _finish(state, now, ResumePhase.RESUMED, "Resumed",
                           f"{how} as {r.plan.key} on {r.node or r.plan.node}")
        if r.status is not RestoreStatus.CLEANED:
            return rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)
        assert r.failure is not None
        if state.cancelled:
            return _finish(state, now, ResumePhase.CANCELLED, "Cancelled",
                           "cancelled by the operator")
        if state.failures >= state.klass.restore_attempts:
            kept = "" if r.plan.artifact is None else \
                f"; checkpoint {r.plan.artifact} is preserved"
            return _finish(state, now, ResumePhase.FAILED, "RestoreFailed",
                           f"{state.failures} attempt(s) failed, the last: {r.failure.reason}: "
                           f"{r.failure.message}{kept}")
        chosen = None if state.chosen is None else state.spec.candidates[state.chosen]
        return self._start(state, obs, now, chosen)

    def evolve(self, state: ResumeState, event: EventLike | DomainEvent) -> ResumeState:
        e = RESUME_EVENTS.decode(event)
        if state.terminal:
            return state
        match e:
            case Started():
                return replace(state, started_at=e.at)
            case ResumeFinished():
                phase = ResumePhase(e.phase)
                failure = Failure(e.reason, e.message) \
                    if phase is ResumePhase.FAILED else state.failure
                return replace(state, status=phase, failure=failure)
            case CancelRequested():
                return replace(state, cancelled=True)
            case CandidateSkipped():
                return replace(state, skipped=(*state.skipped, e.index))
            case CheckpointSelected():
                return replace(state, chosen=e.index, status=ResumePhase.RESTORING)
            case ColdBootChosen():
                return replace(state, status=ResumePhase.COLD_BOOTING)
        restore = rs_.evolve_restore(state.restore, e, machine_id=state.machine_id)
        if restore is not state.restore:
            state = replace(state, restore=restore)
        match e:
            case RestorePodRequested(plan=RestorePlan()):
                return replace(state, attempts=state.attempts + 1)
            case RestoreFailed() if restore is not None and not restore.superseded:
                return replace(state, failures=state.failures + 1, failure=restore.failure)
            case RestoreVerified() if restore is not None:
                return replace(state, instance_id=restore.instance_id)
        return state

    def accept(self, state: ResumeState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        _COMMANDS.decode(command)  # Cancel: the only one
        if state.terminal:
            raise CommandRejected(f"resume {state.machine_id} is already {state.phase}")
        if state.cancelled:
            return ()
        return (CancelRequested(at=now).recorded({"command": "Cancel"}),)

    def load_state(self, data: JsonObject) -> ResumeState:
        return decode(ResumeState, data)


def _problem(cand: Candidate, tag: TagView) -> str | None:
    if not cand.artifact.endswith("@" + tag.digest):
        return f"the registry resolved it to another digest {tag.digest}"
    seen = tag.annotations.get(protocol.MANIFEST_CHECKPOINT_ID)
    if cand.checkpoint_id is not None and seen != cand.checkpoint_id:
        return f"manifest names checkpoint {seen!r}, not {cand.checkpoint_id!r}"
    seen_uid = tag.annotations.get(protocol.MANIFEST_SOURCE_POD_UID)
    if cand.source_uid is not None and seen_uid != cand.source_uid:
        return f"manifest names source pod uid {seen_uid!r}, not {cand.source_uid!r}"
    return None


def _finish(state: ResumeState, now: datetime, phase: ResumePhase, reason: str, message: str,
            facts: JsonObject | None = None) -> Step:
    return finish(ResumeFinished(at=now, phase=phase.value, reason=reason,
                                 message=message).recorded(facts),
                  machine_id=state.machine_id, namespace=state.spec.namespace,
                  pod_name=state.spec.name,
                  pod_uid=None if state.restore is None else state.restore.uid,
                  warning=phase is ResumePhase.FAILED, reason=f"Resume{phase.value}",
                  message=f"{reason}: {message}")
