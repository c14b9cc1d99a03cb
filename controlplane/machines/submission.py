"""Submission checks: is this request sane against the cluster as observed, and may it run now?

Two pure layers, called by the API/CLI before a machine is created:

- :func:`validate_submission` normalises the spec with the kind's ``validate_spec`` (strict
  artifact references, class validation) and checks it against an :class:`Observation` of
  :func:`submission_interests`: the pod exists with the given UID and is Running; the
  target node exists, is Ready and not cordoned, and is not the pod's current node; the
  nodes a restore may run on report a runtime that can restore (containerd cannot), and a
  migration's source and target restore the same way (``config.runtimes``).
  Bad input raises :class:`SubmissionRejected` naming the field and the fix; a probe error
  raises :class:`SubmissionUnverifiable` (retry later: an error is not an answer).
- :func:`admission` decides over the list of active operations: one active operation per
  workload (else ``Reject``), and per-cluster / per-source-node concurrency limits, which
  ``Queue`` rather than refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, NodeView, Observation, PodView, ProbeError
from controlplane.machines.base.specs import PodRef, pod_ref
from controlplane.machines.catalog import product_kinds
from controlplane.machines.config.classes import parse_class
from controlplane.machines.config.runtimes import RestorePath, paths_agree, restore_path

# Kinds whose spec names a running source pod, and the spec key of their target node.
_SOURCE_KINDS = {"checkpoint": None, "migration": "target_node", "suspend": None}
_TARGET_KINDS = {"restore": "node", "resume": "node"}
#: Kinds that only run other operations (a drain): never counted against the limits.
GROUP_KINDS = frozenset({"drain"})


class SubmissionRejected(InvalidSpec):
    """The request is wrong; the message names the field and the fix."""


class SubmissionUnverifiable(Exception):
    """A probe needed to validate the request failed; retry (it is not a rejection)."""


def submission_interests(kind: str, spec: JsonObject) -> Interests:
    """What to observe before :func:`validate_submission` (pod, target node)."""
    pods: set[str] = set()
    nodes: set[str] = set()
    pod = spec.get("pod")
    if kind in _SOURCE_KINDS and isinstance(pod, dict):
        pods.add(f"{pod.get('namespace')}/{pod.get('name')}")
    target_key = _SOURCE_KINDS.get(kind) or _TARGET_KINDS.get(kind)
    target = spec.get(target_key) if target_key else None
    if isinstance(target, str):
        nodes.add(target)
    source = spec.get("source_node")
    if kind == "migration" and isinstance(source, str):
        nodes.add(source)  # a rollback restores there: its runtime must restore too
    return Interests(pods=frozenset(pods), nodes=frozenset(nodes))


def validate_submission(kind: str, spec: JsonObject, observation: Observation) -> JsonObject:
    """The normalised spec, or :class:`SubmissionRejected` / :class:`SubmissionUnverifiable`."""
    deciders = {d.kind: d for d in product_kinds()}
    if kind not in deciders:
        raise SubmissionRejected(f"unknown kind {kind!r}; known: {', '.join(sorted(deciders))}")
    try:
        normal = deciders[kind].validate_spec(spec)
    except SubmissionRejected:
        raise
    except InvalidSpec as err:
        raise SubmissionRejected(str(err)) from None
    current: str | None = None
    if kind in _SOURCE_KINDS:
        current = check_pod(observation, pod_ref(normal["pod"])).node
    target_key = _SOURCE_KINDS.get(kind) or _TARGET_KINDS.get(kind)
    target = normal.get(target_key) if target_key else None
    if isinstance(target, str):
        node = check_target_node(observation, target, field=f"spec.{target_key}",
                                 current=current)
        overrides = parse_class(normal.get("class")).runtime_paths()
        path = check_restore_path(node, field=f"spec.{target_key}", overrides=overrides)
        if kind == "migration":
            check_same_path(observation, current, path, target, overrides)
    if kind == "migration" and normal.get("source_node") != current:
        raise SubmissionRejected(f"spec.source_node {normal.get('source_node')!r} is not "
                                 f"where the pod runs ({current!r}); resubmit with "
                                 f"source_node {current!r}")
    return normal


def check_restore_path(node: NodeView, *, field: str,
                       overrides: Mapping[str, str] | None = None) -> RestorePath:
    """How ``node`` restores; a runtime that cannot is refused, naming it."""
    path = restore_path(node.runtime, overrides)
    if not isinstance(path, RestorePath):
        raise SubmissionRejected(f"{field}: node {node.name!r} cannot restore: {path}")
    return path


def check_same_path(observation: Observation, source: str | None, target_path: RestorePath,
                    target: str, overrides: Mapping[str, str] | None = None) -> None:
    """A migration's source captures what its target can restore (and a rollback to the
    source restores it there)."""
    fact = observation.nodes.get(source) if source else None
    if not isinstance(fact, NodeView):
        return  # not observed: the restore step decides per attempt
    source_path = check_restore_path(fact, field="spec.source_node", overrides=overrides)
    if not paths_agree(source_path, target_path):
        raise SubmissionRejected(
            f"spec.target_node: node {target!r} restores by {_how(target_path)}, but the "
            f"source node {source!r} captures for {_how(source_path)} "
            f"({fact.runtime or 'no runtime reported'}): a checkpoint moves only between "
            "nodes of one kind; pick a target that runs the source's runtime")


def _how(path: RestorePath) -> str:
    return "CRI-O (checkpoint images)" if path is RestorePath.RUNTIME else "the node agent"


def check_pod(observation: Observation, ref: PodRef, *, field: str = "spec.pod") -> PodView:
    """The pod exists, is the one with ``ref.uid``, and is Running."""
    fact = observation.pods.get(ref.key)
    if isinstance(fact, ProbeError):
        raise SubmissionUnverifiable(f"could not read pod {ref.key} ({fact.error_class}: "
                                     f"{fact.message}); retry")
    if ref.key not in observation.pods or fact is None:
        raise SubmissionRejected(f"{field}: unknown pod {ref.key}; check the namespace and "
                                 "name (kubectl get pod -n NAMESPACE)")
    if fact.uid != ref.uid:
        raise SubmissionRejected(f"{field}.uid {ref.uid!r} does not match pod {ref.key} "
                                 f"(uid {fact.uid!r}): it was recreated; resubmit with the "
                                 "current uid if this is the pod you mean")
    if fact.deleting:
        raise SubmissionRejected(f"{field}: pod {ref.key} is terminating; nothing to capture")
    if fact.phase != "Running":
        raise SubmissionRejected(f"{field}: pod {ref.key} is {fact.phase}, not Running; wait "
                                 "until it runs")
    return fact


def check_target_node(observation: Observation, node: str, *, field: str,
                      current: str | None) -> NodeView:
    """The node exists, is Ready, is not cordoned, and is not ``current``."""
    if current is not None and node == current:
        raise SubmissionRejected(f"{field} {node!r} is the node the pod already runs on; "
                                 "pick another node")
    fact = observation.nodes.get(node)
    if isinstance(fact, ProbeError):
        raise SubmissionUnverifiable(f"could not read node {node} ({fact.error_class}: "
                                     f"{fact.message}); retry")
    if fact is None:
        raise SubmissionRejected(f"{field}: unknown node {node!r}; list nodes with "
                                 "kubectl get nodes")
    if fact.unschedulable:
        raise SubmissionRejected(f"{field}: node {node!r} is cordoned; uncordon it or pick "
                                 "another node")
    if not fact.ready:
        raise SubmissionRejected(f"{field}: node {node!r} is NotReady; pick a Ready node")
    return fact


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
