"""Submission checks: is this request sane against the cluster as observed, and may it run now?

Two pure layers, called by the use case (``app.requests``) before a machine is created:

- :func:`validate_submission` normalises the spec with the kind's ``validate_spec`` (strict
  artifact references, class validation) and checks it against an :class:`Observation` of
  :func:`submission_interests`, with the kind's own checks (its ``request.py``:
  ``RequestKind.check``, composed of :mod:`controlplane.machines.base.checks`). Bad input
  raises :class:`SubmissionRejected` naming the field and the fix; a probe error raises
  :class:`SubmissionUnverifiable` (retry later: an error is not an answer).
- :func:`admission` decides over the list of active operations: one active operation per
  workload (else ``Reject``), and per-cluster / per-source-node concurrency limits, which
  ``Queue`` rather than refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.engine.decider import Decider, InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation
from controlplane.machines.base.requests import (
    RequestKind,
    SubmissionRejected,
    SubmissionUnverifiable,
)
from controlplane.machines.catalog import kinds

#: Kinds that only run other operations (a drain): never counted against the limits.
GROUP_KINDS = frozenset({"drain"})

__all__ = ["GROUP_KINDS", "SubmissionRejected", "SubmissionUnverifiable"]


def _requested(kind: str) -> tuple[Decider[Any], RequestKind]:
    found = kinds().get(kind)
    if found is None or found.request is None:
        known = sorted(k for k, v in kinds().items() if v.request is not None)
        raise SubmissionRejected(f"unknown kind {kind!r}; known: {', '.join(known)}")
    return found.decider, found.request


def submission_interests(kind: str, spec: JsonObject) -> Interests:
    """What to observe before :func:`validate_submission` (pod, target node) for a spec
    the kind's ``validate_spec`` accepts; nothing for one it will refuse."""
    decider, requests = _requested(kind)
    try:
        return requests.interests(decider.validate_spec(spec))
    except InvalidSpec:
        return Interests()


def validate_submission(kind: str, spec: JsonObject, observation: Observation) -> JsonObject:
    """The normalised spec, or :class:`SubmissionRejected` / :class:`SubmissionUnverifiable`."""
    decider, requests = _requested(kind)
    try:
        normal: JsonObject = decider.validate_spec(spec)
    except SubmissionRejected:
        raise
    except InvalidSpec as err:
        raise SubmissionRejected(str(err)) from None
    requests.check(normal, observation)
    return normal


@dataclass(frozen=True)
class ActiveOperation:
    """A non-terminal operation (from the machines projection)."""

    machine_id: str
    kind: str
    workload: str  # namespace/name of the pod it acts on
    source_node: str | None
    queued: bool = False


@dataclass(frozen=True)
class OperationRequest:
    kind: str
    workload: str
    source_node: str | None


@dataclass(frozen=True)
class Limits:
    max_cluster: int = 10
    max_per_source_node: int = 2

    def __post_init__(self) -> None:
        for name in ("max_cluster", "max_per_source_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"limits.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Admit:
    pass


@dataclass(frozen=True)
class Queue:
    reason: str


@dataclass(frozen=True)
class Reject:
    reason: str


Admission = Admit | Queue | Reject


def admission(request: OperationRequest, active: Sequence[ActiveOperation],
              limits: Limits = Limits()) -> Admission:
    """Admit, queue (limits) or reject (another operation owns the workload)."""
    same = next((op for op in active if op.workload == request.workload), None)
    running: dict[str, int] = {}
    on_node: dict[str, int] = {}
    for op in active:
        if not op.queued:
            running[op.kind] = running.get(op.kind, 0) + 1
            if request.source_node is not None and op.source_node == request.source_node:
                on_node[op.kind] = on_node.get(op.kind, 0) + 1
    return admission_from_counts(request, same, running, on_node, limits)


def admission_from_counts(request: OperationRequest, same_workload: ActiveOperation | None,
                          running_by_kind: Mapping[str, int],
                          on_node_by_kind: Mapping[str, int],
                          limits: Limits = Limits()) -> Admission:
    """:func:`admission` from what the store can count without listing every live
    operation: the live operation on the same workload (if any), and the operations
    running (not queued) by kind, in the cluster and on the request's source node."""
    if same_workload is not None:
        state = "queued" if same_workload.queued else "running"
        return Reject(f"workload {request.workload} already has a {state} "
                      f"{same_workload.kind} ({same_workload.machine_id}); wait for it to "
                      "finish or cancel it")
    if request.kind in GROUP_KINDS:
        return Admit()  # a drain moves nothing itself; its children are admitted one by one
    running = sum(n for kind, n in running_by_kind.items() if kind not in GROUP_KINDS)
    if running >= limits.max_cluster:
        return Queue(f"cluster limit: {running} of {limits.max_cluster} operations running")
    if request.source_node is not None:
        on_node = sum(n for kind, n in on_node_by_kind.items() if kind not in GROUP_KINDS)
        if on_node >= limits.max_per_source_node:
            return Queue(f"node limit: {on_node} of {limits.max_per_source_node} "
                         f"operations running on source node {request.source_node}")
    return Admit()
