"""Operations on the source pod after a capture: release it, kill it, or delete it.

- ``Release`` removes the capture request annotations: the agent resumes the workload
  (success without quiesce, wake in place, a withdrawn or failed capture).
- ``Kill`` deletes the pod after a failed capture when the class says the workload cannot
  be resumed (``on_failure: Kill``).
- ``Delete`` deletes the source after its artifact was verified (migration, suspend).

Every operation carries the source UID as a precondition (gate 4), is verified by
observation (released: the request is gone from the pod; killed/deleted: the pod is gone,
replaced or terminating), issued again when a crash lost it, and bounded by a deadline.
Destructive operations are only issued when the owner says the guard holds (a clean pod
observation, a verified artifact): ``may_act``. Status flow::

    (started) Issued --Source{Released,Killed,Deleted}--> Done
              Issued --{Release,Kill,SourceDeletion}Failed--> Failed

Used by the checkpoint, migration and suspend machines. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Observation, PodFact, PodView, ProbeError, TagView
from controlplane.machines.base.events import ActionFailed, DomainEvent
from controlplane.machines.base.facts import merge_facts, pod_facts, tag_facts
from controlplane.machines.base.failures import ActionError, Failure
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.stepping import Step, action_key, emit, failing, need, wait
from controlplane.machines.base.timing import (
    REISSUE_AFTER,
    may_reissue,
    next_poll,
    reissue_backoff,
    seconds,
)
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import delete_pod, remove_pod_annotations

_NOT_OBSERVED = ProbeError("NotObserved", "the pod was not observed")


class SourceOpKind(StrEnum):
    RELEASE = "Release"
    KILL = "Kill"
    DELETE = "Delete"


class SourceOpStatus(StrEnum):
    ISSUED = "Issued"
    DONE = "Done"
    FAILED = "Failed"




@dataclass(frozen=True)
class SourceOpRequested(DomainEvent):
    """An operation on the source was issued. The first carries its ``reason`` and
    ``deadline``; a reissue (``reissue``) only its ``attempt``. Recorded as one of the
    three subclasses below, never as itself."""

    at: datetime
    op: SourceOpKind
    attempt: int
    reason: str | None = None
    deadline: datetime | None = None
    reissue: bool | None = None


@dataclass(frozen=True)
class SourceOpDone(DomainEvent):
    """The operation was observed done, and ``how`` (see :func:`effect`)."""

    at: datetime
    op: SourceOpKind
    how: str


@dataclass(frozen=True)
class SourceOpFailed(DomainEvent):
    at: datetime
    op: SourceOpKind
    reason: str
    message: str


@dataclass(frozen=True)
class ReleaseRequested(SourceOpRequested):
    pass


@dataclass(frozen=True)
class KillRequested(SourceOpRequested):
    pass


@dataclass(frozen=True)
class SourceDeletionRequested(SourceOpRequested):
    pass


@dataclass(frozen=True)
class SourceReleased(SourceOpDone):
    pass


@dataclass(frozen=True)
class SourceKilled(SourceOpDone):
    pass


@dataclass(frozen=True)
class SourceDeleted(SourceOpDone):
    pass


@dataclass(frozen=True)
class ReleaseFailed(SourceOpFailed):
    pass


@dataclass(frozen=True)
class KillFailed(SourceOpFailed):
    pass


@dataclass(frozen=True)
class SourceDeletionFailed(SourceOpFailed):
    pass


@dataclass(frozen=True)
class SourceVanished(DomainEvent):
    """The source went away on its own (``during`` a delete or a wake in place); a
    migration then restores on ``target``."""

    at: datetime
    during: str
    target: str | None = None


@dataclass(frozen=True)
class SourceDeletionAborted(DomainEvent):
    """The delete guard did not hold (gate 1): the source was not deleted."""

    at: datetime
    reason: str
    message: str


_REQUESTED: dict[SourceOpKind, type[SourceOpRequested]] = {
    SourceOpKind.RELEASE: ReleaseRequested, SourceOpKind.KILL: KillRequested,
    SourceOpKind.DELETE: SourceDeletionRequested}
_DONE: dict[SourceOpKind, type[SourceOpDone]] = {
    SourceOpKind.RELEASE: SourceReleased, SourceOpKind.KILL: SourceKilled,
    SourceOpKind.DELETE: SourceDeleted}
_FAILED: dict[SourceOpKind, type[SourceOpFailed]] = {
    SourceOpKind.RELEASE: ReleaseFailed, SourceOpKind.KILL: KillFailed,
    SourceOpKind.DELETE: SourceDeletionFailed}
#: The source step's events, for the sets of the kinds that compose it.
SOURCE_EVENTS: tuple[type[DomainEvent], ...] = (
    *_REQUESTED.values(), *_DONE.values(), *_FAILED.values(), SourceVanished,
    SourceDeletionAborted)


@dataclass(frozen=True)
class SourcePod:
    """The source pod, by name and the UID observed at submission."""

    namespace: str
    name: str
    uid: str
    checkpoint_id: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SourceOp:
    kind: SourceOpKind
    status: SourceOpStatus = SourceOpStatus.ISSUED
    attempt: int = 1
    issued_at: datetime | None = None
    deadline: datetime | None = None
    outcome: str = ""  # how it was observed done: "annotations-removed" | "pod-gone" | ...
    failure: Failure | None = None
    action_error: ActionError | None = None

    @property
    def finished(self) -> bool:
        return self.status is not SourceOpStatus.ISSUED


def op_key(machine_id: str, kind: SourceOpKind, attempt: int) -> str:
    return action_key(machine_id, "source", kind.value.lower(), attempt)


def start_source_op(kind: SourceOpKind, src: SourcePod, obs: Observation, now: datetime, *,
                    machine_id: str, timeout: int, reason: str,
                    facts: JsonObject | None = None) -> Step:
    """Issue ``kind`` on the source (the owner has checked any guard)."""
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    event = _REQUESTED[kind](at=now, op=kind, attempt=1, reason=reason,
                             deadline=now + seconds(timeout)).recorded(
        merge_facts(pod_facts(src.key, pod), facts or {}))
    return emit(event, actions=[_action(kind, src, machine_id, 1, reason)])


def effect(kind: SourceOpKind, src: SourcePod, pod: PodFact) -> str | None:
    """How the operation is observed done, or ``None`` (not done, or unknown)."""
    if isinstance(pod, ProbeError):
        return None
    if pod is None or pod.uid != src.uid:
        return "pod-gone"
    if pod.deleting:
        return "pod-terminating"
    if kind is SourceOpKind.RELEASE and not protocol.has_capture_request(pod, src.checkpoint_id):
        return "annotations-removed"
    return None


def decide_source_op(op: SourceOp, src: SourcePod, obs: Observation, now: datetime, *,
                     machine_id: str, may_act: bool = True, check: str | None = None) -> Step:
    """Verify, re-issue or fail the operation in flight. ``check``: a registry tag not
    looked up yet that re-issuing rests on (``may_act`` is then decided on it)."""
    if op.finished:
        return Step()
    assert op.issued_at is not None
    assert op.deadline is not None
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    facts = pod_facts(src.key, pod)
    how = effect(op.kind, src, pod)
    if how is not None:
        return emit(_DONE[op.kind](at=now, op=op.kind, how=how).recorded(facts))
    error = op.action_error
    if error is not None and not may_reissue(error, op.attempt):
        return _failed(op, now, "ActionFailed", error.message,
                       merge_facts(facts, error.facts()))
    if now >= op.deadline:
        return _failed(op, now, "Timeout",
                       f"{op.kind.value.lower()} of {src.key} not observed in time", facts)
    reissue_at = op.issued_at + REISSUE_AFTER
    if error is not None:  # retryable, attempts left: issue it again, later
        reissue_at = op.issued_at + reissue_backoff(op.attempt)
        facts = merge_facts(facts, error.facts())
    if isinstance(pod, PodView) and check is not None and now >= reissue_at:
        return need(check)
    if isinstance(pod, PodView) and may_act and now >= reissue_at:
        attempt = op.attempt + 1
        event = _REQUESTED[op.kind](at=now, op=op.kind, attempt=attempt,
                                    reissue=True).recorded(facts)
        return emit(event, actions=[_action(op.kind, src, machine_id, attempt, "reissue")])
    acts = may_act or check is not None
    return wait(op.deadline, reissue_at if isinstance(pod, PodView) and acts else None)


@dataclass(frozen=True)
class Unstuck:
    """The unstick (or wake-in-place) operation is over; ``note`` says what went wrong."""

    note: str = ""
    how: str = ""


def decide_unstick(op: SourceOp | None, src: SourcePod, obs: Observation, now: datetime, *,
                   machine_id: str, kill: bool, timeout: int, since: datetime,
                   reason: str) -> Step | Unstuck:
    """Release (or, when ``kill``, delete) the source after a failed or withdrawn capture.

    A kill is destructive, so it is only issued on a clean observation of the source
    (gate 3); if none comes before ``since + timeout`` the source is left as it is and
    the note says so.
    """
    kind = SourceOpKind.KILL if kill else SourceOpKind.RELEASE
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    if op is None or op.kind is not kind:
        if pod is None or (isinstance(pod, PodView) and pod.uid != src.uid):
            return Unstuck("", "pod-gone")
        if isinstance(pod, ProbeError) and kill:
            deadline = since + seconds(timeout)
            if now >= deadline:
                return Unstuck("the source could not be observed, so it was not killed")
            return wait(deadline)
        return start_source_op(kind, src, obs, now, machine_id=machine_id, timeout=timeout,
                               reason=reason)
    if op.status is SourceOpStatus.ISSUED:
        return decide_source_op(op, src, obs, now, machine_id=machine_id,
                                may_act=isinstance(pod, PodView))
    if op.failure is not None:
        return Unstuck(f"{op.kind.value.lower()} failed: {op.failure.message}", op.outcome)
    return Unstuck("", op.outcome)


def decide_deletion(op: SourceOp | None, src: SourcePod, pinned: str, obs: Observation,
                    now: datetime, *, machine_id: str, verified_at: datetime,
                    timeout: int) -> Step:
    """Delete the source once its artifact is verified (gates 1, 3, 4).

    The delete is issued (and re-issued) only when this very observation shows the pinned
    artifact with this checkpoint's provenance *and* the source by its UID. A source that
    is already gone is recorded as ``SourceVanished``; an artifact that vanished or a
    probe error lasting to the deadline ends in ``SourceDeletionAborted``: the owner then
    wakes the workload in place instead of deleting it.
    """
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    tag = obs.tags.get(pinned, _NOT_OBSERVED)
    looked = pinned in obs.tags
    facts = pod_facts(src.key, pod)
    if looked:
        facts = merge_facts(facts, tag_facts(pinned, tag))
    problem = "it is gone" if tag is None else None
    if isinstance(tag, TagView):
        problem = protocol.provenance_problem(tag, checkpoint_id=src.checkpoint_id,
                                              source_uid=src.uid)
    if op is not None:
        guard = isinstance(pod, PodView) and isinstance(tag, TagView) and problem is None
        return decide_source_op(op, src, obs, now, machine_id=machine_id, may_act=guard,
                                check=None if looked else pinned)
    if pod is None or (isinstance(pod, PodView) and (pod.uid != src.uid or pod.deleting)):
        return emit(SourceVanished(at=now, during="delete").recorded(facts))
    if not looked and isinstance(pod, PodView):
        return need(pinned)  # gate 1: the artifact, seen in this very decision
    deadline = verified_at + seconds(timeout)
    if isinstance(pod, ProbeError) or isinstance(tag, ProbeError):
        if now >= deadline:
            return emit(SourceDeletionAborted(
                at=now, reason="Timeout", message="the source and its artifact could not "
                "both be confirmed before the delete deadline; the source was not deleted",
            ).recorded(facts))
        return wait(deadline, next_poll(verified_at, now))
    if problem is not None:
        return emit(SourceDeletionAborted(
            at=now, reason="ArtifactLost",
            message=f"artifact {pinned} cannot be trusted before deleting the source: "
                    f"{problem}").recorded(facts))
    return start_source_op(SourceOpKind.DELETE, src, obs, now, machine_id=machine_id,
                           timeout=timeout, reason=f"artifact {pinned} verified", facts=facts)


def _failed(op: SourceOp, now: datetime, reason: str, message: str,
            facts: JsonObject) -> Step:
    return failing(_FAILED[op.kind](at=now, op=op.kind, reason=reason,
                                    message=message).recorded(facts))


def _action(kind: SourceOpKind, src: SourcePod, machine_id: str, attempt: int,
            reason: str) -> Action:
    key = op_key(machine_id, kind, attempt)
    if kind is SourceOpKind.RELEASE:
        return remove_pod_annotations(key, namespace=src.namespace, name=src.name, uid=src.uid,
                                      keys=protocol.CAPTURE_REQUEST_KEYS)
    return delete_pod(key, namespace=src.namespace, name=src.name, uid=src.uid,
                      reason=f"{kind.value.lower()}: {reason}")


def evolve_source_op(op: SourceOp | None, event: DomainEvent, *,
                     machine_id: str) -> SourceOp | None:
    """Fold one event; a first ``*Requested`` (attempt 1) starts a new operation."""
    match event:
        case SourceOpRequested(attempt=1, deadline=deadline) if deadline is not None:
            return SourceOp(kind=event.op, attempt=1, issued_at=event.at, deadline=deadline)
        case SourceOpRequested() if op is not None:
            return replace(op, attempt=event.attempt, issued_at=event.at, action_error=None)
        case SourceOpDone() if op is not None:
            return replace(op, status=SourceOpStatus.DONE, outcome=event.how,
                           action_error=None)
        case SourceOpFailed() if op is not None:
            return replace(op, status=SourceOpStatus.FAILED, action_error=None,
                           failure=Failure(event.reason, event.message))
        case ActionFailed() if op is not None and not op.finished:
            error = ActionError.from_event(event)
            if error.key == op_key(machine_id, op.kind, op.attempt):
                return replace(op, action_error=error)
    return op
