"""The garbage-collection step: drop an artifact once a restore from it is verified.

Used by the migration machine after ``RestoreVerified`` (gate 2 holds by construction:
this step does not exist before that event). Flow::

    ArtifactKept                                   (retention keeps it: done)
    ArtifactDeletionRequested .. ArtifactDeleted   (observed gone by digest: done)
    ArtifactDeletionFailed -> retry after backoff  (condition + Warning, never success)
    GarbageCollectionAbandoned                     (deadline: a distinct terminal outcome)

A probe error never issues the delete (gate 3), and a failed delete (say 403 from the
registry) is visible as the ``GarbageCollectionFailed`` condition and a Kubernetes
Warning on every failure, retried with exponential backoff until the class's GC deadline
(gate 7). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.engine.decider import Action
from controlplane.engine.observation import Observation, ProbeError
from controlplane.machines.base.events import ActionFailed, DomainEvent
from controlplane.machines.base.facts import merge_facts, tag_facts
from controlplane.machines.base.failures import ActionError
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.stepping import Step, action_key, emit, need, wait
from controlplane.machines.base.timing import REISSUE_AFTER, backoff, next_poll
from controlplane.machines.contract.actions import EventType, delete_manifest, emit_event


@dataclass(frozen=True)
class ArtifactKept(DomainEvent):
    at: datetime
    artifact: str
    reason: str


@dataclass(frozen=True)
class ArtifactDeletionRequested(DomainEvent):
    at: datetime
    artifact: str
    attempt: int


@dataclass(frozen=True)
class ArtifactDeleted(DomainEvent):
    """The registry answered 404 for the pinned artifact: it is gone."""

    at: datetime
    artifact: str


@dataclass(frozen=True)
class ArtifactDeletionFailed(DomainEvent):
    at: datetime
    artifact: str
    failures: int
    retry_at: datetime
    error_class: str
    message: str


@dataclass(frozen=True)
class GarbageCollectionAbandoned(DomainEvent):
    at: datetime
    artifact: str
    message: str


#: The collection step's events, for the sets of the kinds that compose it.
COLLECT_EVENTS: tuple[type[DomainEvent], ...] = (
    ArtifactKept, ArtifactDeletionRequested, ArtifactDeleted, ArtifactDeletionFailed,
    GarbageCollectionAbandoned)
RETRY_BASE = timedelta(seconds=10)
RETRY_CAP = timedelta(minutes=10)
_NOT_OBSERVED = ProbeError("NotObserved", "the artifact was not observed")


@dataclass(frozen=True)
class Collection:
    pinned: str  # registry/repo@sha256:...
    deadline: datetime
    attempt: int = 0
    issued_at: datetime | None = None
    failures: int = 0
    retry_at: datetime | None = None
    last_error: str | None = None
    action_error: ActionError | None = None
    outcome: str = ""  # kept | deleted | abandoned

    @property
    def repository(self) -> str:
        return self.pinned.split("@", 1)[0]

    @property
    def digest(self) -> str:
        return self.pinned.split("@", 1)[1]


@dataclass(frozen=True)
class Notify:
    """Who Kubernetes Warnings are about (the restored pod)."""

    namespace: str
    pod_name: str
    pod_uid: str | None


def delete_key(machine_id: str, attempt: int) -> str:
    return action_key(machine_id, "gc", "delete", attempt)


def decide_collection(c: Collection, obs: Observation, now: datetime, *, machine_id: str,
                      keep: bool, notify: Notify) -> Step:
    """The collection's next step; idle steps carry the wake time."""
    if c.outcome:
        return Step()
    if keep:
        return emit(ArtifactKept(at=now, artifact=c.pinned,
                                 reason="retention keeps the artifact").recorded())
    looked = c.pinned in obs.tags
    if not looked and (c.attempt or c.action_error is not None):
        return need(c.pinned)  # the first delete needs no look; each later step does
    tag = obs.tags.get(c.pinned, _NOT_OBSERVED)
    facts = tag_facts(c.pinned, tag) if looked else {}
    if tag is None:
        return emit(ArtifactDeleted(at=now, artifact=c.pinned).recorded(facts))
    if c.action_error is not None:
        failures = c.failures + 1
        retry_at = now + backoff(failures, base=RETRY_BASE, cap=RETRY_CAP)
        event = ArtifactDeletionFailed(
            at=now, artifact=c.pinned, failures=failures, retry_at=retry_at,
            error_class=c.action_error.error_class, message=c.action_error.message,
        ).recorded(merge_facts(facts, c.action_error.facts()))
        return emit(event, actions=[_warning(machine_id, notify, f"failed-{failures}",
                                             "GarbageCollectionFailed",
                                             f"cannot delete {c.pinned} "
                                             f"({c.action_error.error_class}: "
                                             f"{c.action_error.message}); retrying at "
                                             f"{retry_at.isoformat()}")])
    if now >= c.deadline and looked:
        message = (f"artifact {c.pinned} still exists at the GC deadline"
                   + (f"; last error: {c.last_error}" if c.last_error else ""))
        return emit(GarbageCollectionAbandoned(at=now, artifact=c.pinned,
                                               message=message).recorded(facts),
                    actions=[_warning(machine_id, notify, "abandoned",
                                      "GarbageCollectionAbandoned", message)])
    if isinstance(tag, ProbeError) and looked:
        return wait(c.deadline, next_poll(c.issued_at or now, now))
    due = c.attempt == 0 or (c.retry_at is not None and now >= c.retry_at) or (
        c.retry_at is None and c.issued_at is not None and now >= c.issued_at + REISSUE_AFTER)
    if due:
        attempt = c.attempt + 1
        event = ArtifactDeletionRequested(at=now, artifact=c.pinned,
                                          attempt=attempt).recorded(facts)
        return emit(event, actions=[delete_manifest(delete_key(machine_id, attempt),
                                                    repository=c.repository, digest=c.digest)])
    assert c.issued_at is not None
    return wait(c.deadline, c.retry_at,
                None if c.retry_at else c.issued_at + REISSUE_AFTER,
                next_poll(c.issued_at, now))


def _warning(machine_id: str, notify: Notify, suffix: str, reason: str,
             message: str) -> Action:
    return emit_event(action_key(machine_id, "event", "gc", suffix), namespace=notify.namespace,
                      pod_name=notify.pod_name, pod_uid=notify.pod_uid,
                      type_=EventType.WARNING, reason=reason, message=message)


def evolve_collection(c: Collection, event: DomainEvent, *, machine_id: str) -> Collection:
    match event:
        case ArtifactKept():
            return replace(c, outcome="kept")
        case ArtifactDeleted():
            return replace(c, outcome="deleted", action_error=None)
        case GarbageCollectionAbandoned():
            return replace(c, outcome="abandoned", action_error=None)
        case ArtifactDeletionRequested():
            return replace(c, attempt=event.attempt, issued_at=event.at, retry_at=None)
        case ArtifactDeletionFailed():
            return replace(c, failures=event.failures, action_error=None,
                           retry_at=event.retry_at,
                           last_error=f"{event.error_class}: {event.message}")
        case ActionFailed() if not c.outcome and c.attempt:
            error = ActionError.from_event(event)
            if error.key == delete_key(machine_id, c.attempt):
                return replace(c, action_error=error)
    return c
