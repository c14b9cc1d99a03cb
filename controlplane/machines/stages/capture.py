"""The capture step: ask the node agent for a capture, and let the registry prove it.

Shared by the checkpoint, migration and suspend machines (one history each: the step's
events are the owner's events). Status flow::

    Pending --CaptureRequested--> Requested --CaptureReported--> Reported
        Requested/Reported --ArtifactVerified--> Verified
        any non-final --CaptureFailed--> Failed

- ``CaptureRequested`` annotates the source pod (UID precondition) with the request; it
  is issued again (``attempt`` + 1, a new key) when the pod does not show the request
  :data:`~controlplane.machines.base.timing.REISSUE_AFTER` later (a crash lost the action).
- ``ArtifactVerified`` needs the tag resolved to a digest whose manifest provenance names
  this checkpoint id and the source pod UID (gate 1); any other manifest is recorded once
  as ``StaleArtifactSeen`` and never trusted. The agent's ``Pushed`` report is a hint.
- ``CaptureFailed`` on: the agent's ``Failed`` report, the request refused
  (``ActionFailed``), the source gone before a push was reported, the deadline. A probe
  error is never a failure by itself (gate 3): the step waits, up to the deadline.

What happens to the workload afterwards (release, kill, delete) is the owner's call, via
:mod:`controlplane.machines.stages.source`. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Observation, PodFact, PodView, ProbeError, TagView
from controlplane.machines.base.codec import OMIT_DEFAULT
from controlplane.machines.base.events import ActionFailed, DomainEvent
from controlplane.machines.base.facts import merge_facts, pod_facts, tag_facts
from controlplane.machines.base.failures import ActionError, Failure
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.refs import parse_tag_ref
from controlplane.machines.base.stepping import Step, action_key, emit, failing, need, wait
from controlplane.machines.base.timing import (
    REISSUE_AFTER,
    may_reissue,
    next_poll,
    reissue_backoff,
    seconds,
)
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import EventType, annotate_pod, emit_event


@dataclass(frozen=True)
class CaptureRequested(DomainEvent):
    """The source pod was annotated with the capture request. The first request carries
    what was asked; a reissue (``reissue``) only its ``attempt``."""

    at: datetime
    attempt: int
    checkpoint_id: str | None = None
    artifact: str | None = None
    containers: tuple[str, ...] | None = None
    quiesce: bool | None = None
    deadline: datetime | None = None
    source_node: str | None = None
    source_instance: str | None = None
    reissue: bool | None = None


@dataclass(frozen=True)
class CaptureReported(DomainEvent):
    """The node agent reported the push (a hint: only the registry proves it)."""

    at: datetime
    digest: str


@dataclass(frozen=True)
class StaleArtifactSeen(DomainEvent):
    """The tag resolved to a manifest whose provenance is not this checkpoint's."""

    at: datetime
    digest: str
    problem: str


@dataclass(frozen=True)
class ArtifactVerified(DomainEvent):
    """The registry holds a manifest with this checkpoint's provenance (gate 1)."""

    at: datetime
    digest: str
    artifact: str
    pinned: str
    size_bytes: int | None = None
    #: Handed-off captures: the manifest's ``archive-digests`` (its JSON text), what a
    #: streamed restore must equal (absent for every other capture).
    archives: str | None = None


@dataclass(frozen=True)
class CaptureFailed(DomainEvent):
    at: datetime
    reason: str
    message: str


#: The capture step's events, for the sets of the kinds that compose it.
CAPTURE_EVENTS: tuple[type[DomainEvent], ...] = (
    CaptureRequested, CaptureReported, StaleArtifactSeen, ArtifactVerified, CaptureFailed)
_NOT_OBSERVED = ProbeError("NotObserved", "the pod was not observed")


class CaptureStatus(StrEnum):
    PENDING = "Pending"
    REQUESTED = "Requested"
    REPORTED = "Reported"
    VERIFIED = "Verified"
    FAILED = "Failed"


@dataclass(frozen=True)
class CaptureSpec:
    """What to capture: fixed for the machine's life."""

    checkpoint_id: str
    namespace: str
    name: str
    uid: str
    artifact: str  # registry/repo:tag
    containers: tuple[str, ...]
    quiesce: bool
    saver: str  # the merged saver container, JSON
    timeout: int  # seconds from the first request to a verified artifact
    seal: str = field(default="", metadata=OMIT_DEFAULT)  # recipients, JSON ("": plain)
    #: A migration mode other than stop-and-copy (:mod:`controlplane.machines.config.modes`).
    mode: str = field(default="", metadata=OMIT_DEFAULT)

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def pinned(self, digest: str) -> str:
        return parse_tag_ref(self.artifact, field="artifact").pinned(digest)


@dataclass(frozen=True)
class Capture:
    status: CaptureStatus = CaptureStatus.PENDING
    attempt: int = 0
    issued_at: datetime | None = None
    deadline: datetime | None = None
    source_node: str | None = None
    source_instance: str = ""  # the source's own instance id: a restore must not reuse it
    reported_digest: str | None = None
    digest: str | None = None
    stale_digests: tuple[str, ...] = ()
    failure: Failure | None = None
    failed_at: datetime | None = None
    action_error: ActionError | None = None
    #: The verified manifest's ``archive-digests`` (JSON; "": it lists none).
    archives: str = field(default="", metadata=OMIT_DEFAULT)

    @property
    def finished(self) -> bool:
        return self.status in (CaptureStatus.VERIFIED, CaptureStatus.FAILED)


def request_key(machine_id: str, attempt: int) -> str:
    return action_key(machine_id, "capture", "request", attempt)


def decide_capture(spec: CaptureSpec, cap: Capture, obs: Observation, now: datetime,
                   *, machine_id: str, started_at: datetime, handoff_to: str = "") -> Step:
    """The capture's next step; an idle step carries the wake time. ``handoff_to``: the
    node whose agent the archives are also streamed to (a streamed migration)."""
    if cap.finished:
        return Step()
    pod = obs.pods.get(spec.pod_key, _NOT_OBSERVED)
    if cap.status is CaptureStatus.PENDING:
        return _request(spec, cap, pod, now, machine_id=machine_id, started_at=started_at,
                        handoff_to=handoff_to)
    return _watch(spec, cap, pod, obs, now, machine_id=machine_id, handoff_to=handoff_to)


def _request(spec: CaptureSpec, cap: Capture, pod: PodFact, now: datetime, *,
             machine_id: str, started_at: datetime, handoff_to: str) -> Step:
    deadline = started_at + seconds(spec.timeout)
    facts = pod_facts(spec.pod_key, pod)
    if isinstance(pod, ProbeError):
        if now >= deadline:
            return _fail(spec, now, "Timeout", "the source pod could not be observed before "
                         "the capture deadline", facts, machine_id)
        return wait(deadline)
    if pod is None or pod.uid != spec.uid or pod.deleting or pod.phase != "Running":
        why = ("is gone" if pod is None else "was replaced by another pod (uid differs)"
               if pod.uid != spec.uid else "is terminating" if pod.deleting
               else f"is {pod.phase}, not Running")
        return _fail(spec, now, "SourceGone", f"source pod {spec.pod_key} {why}", facts,
                     machine_id)
    attempt = cap.attempt + 1
    annotations = protocol.capture_request(
        checkpoint_id=spec.checkpoint_id, artifact=spec.artifact, source_uid=spec.uid,
        containers=spec.containers, quiesce=spec.quiesce, saver=spec.saver, seal=spec.seal,
        mode=spec.mode, handoff_to=handoff_to)
    event = CaptureRequested(
        at=now, attempt=attempt, checkpoint_id=spec.checkpoint_id, artifact=spec.artifact,
        containers=spec.containers, quiesce=spec.quiesce,
        deadline=now + seconds(spec.timeout), source_node=pod.node,
        source_instance=protocol.instance_id(pod)).recorded(facts)
    action = annotate_pod(request_key(machine_id, attempt), namespace=spec.namespace,
                          name=spec.name, uid=spec.uid, annotations=annotations)
    return emit(event, actions=[action])


def _watch(spec: CaptureSpec, cap: Capture, pod: PodFact, obs: Observation, now: datetime,
           *, machine_id: str, handoff_to: str) -> Step:
    assert cap.issued_at is not None
    assert cap.deadline is not None
    if spec.artifact not in obs.tags and _tag_matters(spec, cap, pod, now):
        return need(spec.artifact)
    tag = obs.tags.get(spec.artifact, _NOT_OBSERVED)
    facts = pod_facts(spec.pod_key, pod)
    if spec.artifact in obs.tags:
        facts = merge_facts(facts, tag_facts(spec.artifact, tag))
    if isinstance(tag, TagView):
        problem = protocol.provenance_problem(tag, checkpoint_id=spec.checkpoint_id,
                                              source_uid=spec.uid)
        if problem is None:
            return emit(ArtifactVerified(
                at=now, digest=tag.digest, artifact=spec.artifact,
                pinned=spec.pinned(tag.digest), size_bytes=protocol.archive_bytes(tag),
                archives=_archives(tag),
            ).recorded(facts))
        if tag.digest not in cap.stale_digests:
            return emit(StaleArtifactSeen(at=now, digest=tag.digest,
                                          problem=problem).recorded(facts))
    error = cap.action_error
    if error is not None and not may_reissue(error, cap.attempt):
        return _fail(spec, now, "RequestRejected",
                     f"the capture request could not be written: {error.message}",
                     merge_facts(facts, error.facts()), machine_id)
    annotation_missing = False
    if isinstance(pod, PodView) and pod.uid == spec.uid:
        report = protocol.capture_report(pod, spec.checkpoint_id)
        if report is not None and report.state is protocol.ReportState.FAILED:
            return _fail(spec, now, "AgentFailed",
                         f"the node agent reported: {report.reason or 'no reason given'}",
                         facts, machine_id)
        if (report is not None and report.state is protocol.ReportState.PUSHED
                and cap.status is CaptureStatus.REQUESTED):
            return emit(CaptureReported(at=now, digest=report.digest).recorded(facts))
        annotation_missing = not protocol.has_capture_request(pod, spec.checkpoint_id)
    gone = pod is None or (isinstance(pod, PodView) and (
        pod.uid != spec.uid or pod.deleting or pod.phase in ("Succeeded", "Failed")))
    if gone and cap.status is CaptureStatus.REQUESTED:
        # Once a push was reported, the registry may still prove the artifact: wait for it.
        return _fail(spec, now, "SourceGone",
                     f"source pod {spec.pod_key} went away before the capture was pushed",
                     facts, machine_id)
    reissue_at = cap.issued_at + REISSUE_AFTER
    if error is not None:  # retryable, attempts left: write the request again, later
        reissue_at = cap.issued_at + reissue_backoff(cap.attempt)
        facts = merge_facts(facts, error.facts())
    if annotation_missing and now >= reissue_at and now < cap.deadline:
        return _reissue(spec, cap, now, facts, machine_id, handoff_to)
    if now >= cap.deadline:
        return _fail(spec, now, "Timeout",
                     f"no verified artifact at {spec.artifact} within {spec.timeout}s", facts,
                     machine_id)
    return wait(cap.deadline, next_poll(cap.issued_at, now),
                reissue_at if annotation_missing else None)


def _reissue(spec: CaptureSpec, cap: Capture, now: datetime, facts: JsonObject,
             machine_id: str, handoff_to: str) -> Step:
    attempt = cap.attempt + 1
    annotations = protocol.capture_request(
        checkpoint_id=spec.checkpoint_id, artifact=spec.artifact, source_uid=spec.uid,
        containers=spec.containers, quiesce=spec.quiesce, saver=spec.saver, seal=spec.seal,
        mode=spec.mode, handoff_to=handoff_to)
    event = CaptureRequested(at=now, attempt=attempt, reissue=True).recorded(facts)
    action = annotate_pod(request_key(machine_id, attempt), namespace=spec.namespace,
                          name=spec.name, uid=spec.uid, annotations=annotations)
    return emit(event, actions=[action])


def _archives(tag: TagView) -> str | None:
    """The manifest's ``archive-digests`` in their canonical JSON, or ``None`` (a capture
    that was not handed off lists none: its event reads as it always did)."""
    digests = protocol.archive_digests(tag.annotations)
    return protocol.format_archive_digests(digests) if digests else None


def _tag_matters(spec: CaptureSpec, cap: Capture, pod: PodFact, now: datetime) -> bool:
    """Whether this decision rests on the registry: the agent reported the push (or does
    so in this very observation), the source went away, or the deadline came. While the
    agent works, its progress annotations wake the machine often; none of those looks
    needs the tag, and probing it on each cost ~9 registry requests per migration."""
    assert cap.deadline is not None
    if cap.status is CaptureStatus.REPORTED or now >= cap.deadline:
        return True
    if not isinstance(pod, PodView) or pod.uid != spec.uid:
        return not isinstance(pod, ProbeError)  # gone: a push may still prove it
    if pod.deleting or pod.phase in ("Succeeded", "Failed"):
        return True
    report = protocol.capture_report(pod, spec.checkpoint_id)
    return report is not None and report.state is protocol.ReportState.PUSHED


def _fail(spec: CaptureSpec, now: datetime, reason: str, message: str, facts: JsonObject,
          machine_id: str) -> Step:
    event = CaptureFailed(at=now, reason=reason, message=message).recorded(facts)
    warning = emit_event(action_key(machine_id, "event", "capture-failed"),
                         namespace=spec.namespace, pod_name=spec.name, pod_uid=spec.uid,
                         type_=EventType.WARNING, reason="CaptureFailed",
                         message=f"checkpoint {spec.checkpoint_id}: {reason}: {message}")
    return failing(event, actions=[warning])


def evolve_capture(cap: Capture, event: DomainEvent, *, machine_id: str) -> Capture:
    """Fold one event into the capture (other events leave it unchanged)."""
    match event:
        case CaptureRequested(attempt=1, deadline=deadline) if deadline is not None:
            return replace(cap, status=CaptureStatus.REQUESTED, attempt=1,
                           issued_at=event.at, deadline=deadline,
                           source_node=event.source_node,
                           source_instance=event.source_instance or "")
        case CaptureRequested():
            return replace(cap, attempt=event.attempt, issued_at=event.at, action_error=None)
        case CaptureReported():
            return replace(cap, status=CaptureStatus.REPORTED, reported_digest=event.digest)
        case StaleArtifactSeen():
            return replace(cap, stale_digests=(*cap.stale_digests, event.digest))
        case ArtifactVerified():
            return replace(cap, status=CaptureStatus.VERIFIED, digest=event.digest,
                           action_error=None, archives=event.archives or "")
        case CaptureFailed():
            return replace(cap, status=CaptureStatus.FAILED, action_error=None,
                           failure=Failure(event.reason, event.message), failed_at=event.at)
        case ActionFailed() if not cap.finished:
            error = ActionError.from_event(event)
            if cap.attempt and error.key == request_key(machine_id, cap.attempt):
                return replace(cap, action_error=error)
    return cap
