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

from controlplane.engine.decider import ACTION_FAILED, Action, EventLike
from controlplane.engine.observation import Observation, ProbeError
from controlplane.machines.base.common import (
    REISSUE_AFTER,
    ActionError,
    Step,
    action_key,
    backoff,
    emit,
    event_time,
    merge_facts,
    next_poll,
    stamped,
    tag_facts,
    wait,
)
from controlplane.machines.base.frozen import replace
from controlplane.machines.contract.actions import EventType, delete_manifest, emit_event

ARTIFACT_KEPT = "ArtifactKept"
ARTIFACT_DELETION_REQUESTED = "ArtifactDeletionRequested"
ARTIFACT_DELETED = "ArtifactDeleted"
ARTIFACT_DELETION_FAILED = "ArtifactDeletionFailed"
GC_ABANDONED = "GarbageCollectionAbandoned"
EVENTS = frozenset({ARTIFACT_KEPT, ARTIFACT_DELETION_REQUESTED, ARTIFACT_DELETED,
                    ARTIFACT_DELETION_FAILED, GC_ABANDONED})
FINAL_EVENTS = frozenset({ARTIFACT_KEPT, ARTIFACT_DELETED, GC_ABANDONED})
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
        return emit(stamped(ARTIFACT_KEPT, now, {"artifact": c.pinned,
                                                 "reason": "retention keeps the artifact"}))
    tag = obs.tags.get(c.pinned, _NOT_OBSERVED)
    facts = tag_facts(c.pinned, tag)
    if tag is None:
        return emit(stamped(ARTIFACT_DELETED, now, {"artifact": c.pinned}, facts))
    if c.action_error is not None:
        failures = c.failures + 1
        retry_at = now + backoff(failures, base=RETRY_BASE, cap=RETRY_CAP)
        event = stamped(ARTIFACT_DELETION_FAILED, now, {
            "artifact": c.pinned, "failures": failures, "retry_at": retry_at.isoformat(),
            "error_class": c.action_error.error_class, "message": c.action_error.message},
            merge_facts(facts, c.action_error.facts()))
        return emit(event, actions=[_warning(machine_id, notify, f"failed-{failures}",
                                             "GarbageCollectionFailed",
                                             f"cannot delete {c.pinned} "
                                             f"({c.action_error.error_class}: "
                                             f"{c.action_error.message}); retrying at "
                                             f"{retry_at.isoformat()}")])
    if now >= c.deadline:
        message = (f"artifact {c.pinned} still exists at the GC deadline"
                   + (f"; last error: {c.last_error}" if c.last_error else ""))
        return emit(stamped(GC_ABANDONED, now, {"artifact": c.pinned, "message": message},
                            facts),
                    actions=[_warning(machine_id, notify, "abandoned",
                                      "GarbageCollectionAbandoned", message)])
    if isinstance(tag, ProbeError):
        return wait(c.deadline, next_poll(c.issued_at or now, now))
    due = c.attempt == 0 or (c.retry_at is not None and now >= c.retry_at) or (
        c.retry_at is None and c.issued_at is not None and now >= c.issued_at + REISSUE_AFTER)
    if due:
        attempt = c.attempt + 1
        event = stamped(ARTIFACT_DELETION_REQUESTED, now, {"artifact": c.pinned,
                                                           "attempt": attempt}, facts)
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


def evolve_collection(c: Collection, event: EventLike, *, machine_id: str) -> Collection:
    t, d = event.type, event.data
    if t == ARTIFACT_KEPT:
        return replace(c, outcome="kept")
    if t == ARTIFACT_DELETED:
        return replace(c, outcome="deleted", action_error=None)
    if t == GC_ABANDONED:
        return replace(c, outcome="abandoned", action_error=None)
    if t == ARTIFACT_DELETION_REQUESTED:
        return replace(c, attempt=int(str(d["attempt"])), issued_at=event_time(event),
                       retry_at=None)
    if t == ARTIFACT_DELETION_FAILED:
        return replace(c, failures=int(str(d["failures"])), action_error=None,
                       retry_at=datetime.fromisoformat(str(d["retry_at"])),
                       last_error=f"{d.get('error_class')}: {d.get('message')}")
    if t == ACTION_FAILED and not c.outcome and c.attempt:
        error = ActionError.from_event(event)
        if error.key == delete_key(machine_id, c.attempt):
            return replace(c, action_error=error)
    return c
