"""The drain planner: which pods leave a node, where each goes, and why. Pure.

:func:`plan_drain` takes the cluster as listed (nodes and pods, Kubernetes JSON narrowed
by :func:`node_info` / :func:`pod_info`) and returns a :class:`DrainPlan`: a
:class:`Move` per movable pod (its target and why that node) and a :class:`Left` per pod
it leaves alone (with the reason). Bad input raises :class:`PlanRejected` naming the
problem: unknown node, no other node to drain onto, a target equal to the source or
unknown, a selector that matches nothing.

Rules:

- movable: Running, not terminating, not a DaemonSet or static (mirror) pod, not owned by
  a controller that would recreate it (``machines.owners``: ReplicaSet, StatefulSet, Job,
  custom resources — refused with the owner named), and its
  class allows checkpointing (annotation ``checkpoint.controlplane.dev/checkpoint:
  never`` opts a pod out);
- a target must be Ready, not cordoned, have every ``NoSchedule``/``NoExecute`` taint
  tolerated, match ``nodeSelector`` and REQUIRED node affinity (hostname pins are
  dropped: a restore re-pins the pod to its target), and have room for the pod's CPU,
  memory and pod-count requests in what its pods *and the pods planned onto it* leave of
  its allocatable — so a plan never overfills a node;
- spread: largest pods first, each onto the least allocated fitting node after counting
  what is already planned there (ties by name), so load spreads instead of piling up.

Used by the ``drain`` CLI verb (plan, ``--dry-run``) and recorded in the drain machine's
spec, so the plan the operator saw is the plan that runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.contract.protocol import PREFIX
from controlplane.machines.owners import how_moved, why_not_movable

HOSTNAME = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
MIRROR = "kubernetes.io/config.mirror"
#: ``never`` on a pod: its class does not allow checkpointing; a drain leaves it alone.
CHECKPOINT_POLICY = PREFIX + "checkpoint"

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_SELECTOR_TERM = re.compile(r"^([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)$")


class PlanRejected(InvalidSpec):
    """The drain request is wrong; nothing was changed. The message says what to fix."""


def quantity(value: object) -> float:
    """``500m`` -> 0.5, ``1Gi`` -> 1073741824.0; raises ``ValueError`` when malformed."""
    match = _QUANTITY.match(str(value).strip())
    if not match or match[2] not in _SUFFIX:
        raise ValueError(f"invalid quantity {value!r}")
    return float(match[1]) * _SUFFIX[match[2]]


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0  # cores
    memory: float = 0.0  # bytes
    pods: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory,
                         self.pods + other.pods)

    def fits_in(self, room: Resources) -> str | None:
        """Why this does not fit in ``room`` (``Insufficient cpu``...), or ``None``."""
        for name in ("pods", "cpu", "memory"):
            want, have = getattr(self, name), getattr(room, name)
            if want > 0 and want > have + 1e-9:
                return "Too many pods" if name == "pods" else f"Insufficient {name}"
        return None

    def minus(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory,
                         self.pods - other.pods)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    ready: bool
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    allocatable: Resources = Resources(4.0, 8 * 2.0**30, 110)


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str | None
    phase: str = "Running"
    requests: Resources = Resources(pods=1)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    owner_kinds: tuple[str, ...] = ()
    owner_refusal: str | None = None  # why its controller forbids a move (machines.owners)
    moved_by: str = "bare"  # how it moves (machines.owners.how_moved): bare | adopt
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: REQUIRED node affinity terms (``matchExpressions`` lists), hostname pins dropped.
    affinity_terms: tuple[tuple[Mapping[str, Any], ...], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Move:
    pod: PodInfo
    target: str
    why: str


@dataclass(frozen=True)
class Left:
    pod: PodInfo
    reason: str


@dataclass(frozen=True)
class DrainPlan:
    node: str
    moves: tuple[Move, ...]
    left: tuple[Left, ...]
    #: Per candidate target: requests of its pods plus those planned onto it, and room.
    load: Mapping[str, tuple[Resources, Resources]]
    #: What the plan was asked for (``--to``, ``--selector``): pods found on the node
    #: later are planned the same way.
    targets: tuple[str, ...] = ()
    selector: str = ""

    def to_json(self) -> JsonObject:
        return {
            "node": self.node,
            "moves": [{"pod": m.pod.key, "uid": m.pod.uid, "target": m.target, "why": m.why}
                      for m in self.moves],
            "left": [{"pod": x.pod.key, "reason": x.reason} for x in self.left],
            "targets": {name: {"cpu": round(used.cpu, 3), "cpu_allocatable": alloc.cpu,
                               "memory": used.memory, "memory_allocatable": alloc.memory,
                               "pods": used.pods, "pods_allocatable": alloc.pods}
                        for name, (used, alloc) in sorted(self.load.items())},
        }


# --- narrowing Kubernetes JSON ----------------------------------------------------------

def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(value).items()}


def _resources(values: Mapping[str, Any], default: Resources) -> Resources:
    try:
        return Resources(
            quantity(values["cpu"]) if "cpu" in values else default.cpu,
            quantity(values["memory"]) if "memory" in values else default.memory,
            quantity(values["pods"]) if "pods" in values else default.pods)
    except ValueError:
        return default


def node_info(obj: Mapping[str, Any]) -> NodeInfo:
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    ready = any(_map(c).get("type") == "Ready" and _map(c).get("status") == "True"
                for c in status.get("conditions") or [])
    alloc = _map(status.get("allocatable")) or _map(status.get("capacity"))
    inf = float("inf")
    return NodeInfo(name=str(meta.get("name") or ""), ready=ready,
                    unschedulable=bool(spec.get("unschedulable")),
                    labels=_strings(meta.get("labels")),
                    taints=tuple(_map(t) for t in spec.get("taints") or []),
                    allocatable=_resources(alloc, Resources(inf, inf, inf)))


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """CPU and memory requests (limits stand in), plus one pod."""
    cpu = memory = 0.0
    for c in spec.get("containers") or []:
        res = _map(_map(c).get("resources"))
        req, lim = _map(res.get("requests")), _map(res.get("limits"))
        with_default = {k: req.get(k, lim.get(k)) for k in ("cpu", "memory")}
        got = _resources({k: v for k, v in with_default.items() if v is not None}, Resources())
        cpu, memory = cpu + got.cpu, memory + got.memory
    return Resources(cpu, memory, 1)


def pod_info(obj: Mapping[str, Any], movable: Sequence[str] = ()) -> PodInfo:
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    required = _map(_map(_map(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        exprs = tuple(_map(e) for e in _map(term).get("matchExpressions") or []
                      if _map(e).get("key") != HOSTNAME)
        terms.append(exprs)
    if all(not t for t in terms):
        terms = []  # only hostname pins: a restore replaces them with its target
    selector = {k: v for k, v in _strings(spec.get("nodeSelector")).items() if k != HOSTNAME}
    node = spec.get("nodeName")
    return PodInfo(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""), node=str(node) if node else None,
        phase=str(status.get("phase") or "Pending"), requests=pod_requests(spec),
        labels=_strings(meta.get("labels")), annotations=_strings(meta.get("annotations")),
        deleting=meta.get("deletionTimestamp") is not None,
        owner_kinds=tuple(str(_map(o).get("kind")) for o in meta.get("ownerReferences") or []),
        owner_refusal=why_not_movable(obj, verb="drain", movable=movable),
        moved_by=how_moved(obj, verb="drain", movable=movable),
        node_selector=selector, affinity_terms=tuple(terms),
        tolerations=tuple(_map(t) for t in spec.get("tolerations") or []))


# --- selectors ---------------------------------------------------------------------------

def parse_selector(text: str | None) -> tuple[tuple[str, str, str], ...]:
    """``app=web,tier!=db,gpu`` -> ((key, op, value)...); ``op`` is ``=``, ``!=`` or
    ``exists``. Raises :class:`PlanRejected` when malformed."""
    if not text:
        return ()
    out = []
    for part in (p.strip() for p in text.split(",")):
        if re.fullmatch(r"[A-Za-z0-9_./-]+", part):
            out.append((part, "exists", ""))
            continue
        match = _SELECTOR_TERM.match(part)
        if not match:
            raise PlanRejected(f"--selector: {part!r} is not KEY=VALUE, KEY!=VALUE or KEY")
        out.append((match[1], "!=" if match[2] == "!=" else "=", match[3]))
    return tuple(out)


def selector_matches(selector: Sequence[tuple[str, str, str]],
                     labels: Mapping[str, str]) -> bool:
    for key, op, value in selector:
        if op == "exists" and key not in labels:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return True


# --- the rules ---------------------------------------------------------------------------

def why_left(pod: PodInfo) -> str | None:
    """Why the drain leaves ``pod`` alone, or ``None`` when it can move it."""
    if pod.annotations.get(CHECKPOINT_POLICY) == "never":
        return f"its class does not allow checkpointing ({CHECKPOINT_POLICY}: never)"
    if MIRROR in pod.annotations:
        return "static (mirror) pod: the kubelet owns it"
    if "DaemonSet" in pod.owner_kinds:
        return "DaemonSet pod: it runs on every node"
    if pod.owner_refusal is not None:
        return pod.owner_refusal
    if pod.deleting:
        return "terminating"
    if pod.phase != "Running":
        return f"{pod.phase}, not Running: nothing to checkpoint"
    if not pod.uid:
        return "no uid"
    return None


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def matches_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One node-selector requirement (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``,
    ``Gt``, ``Lt``) against a node's labels (or fields), as the scheduler reads it."""
    key, op = str(expr.get("key", "")), expr.get("operator", "")
    wanted = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in wanted
    if op == "NotIn":
        return not present or labels[key] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            seen, limit = int(labels[key]), int(wanted[0])
        except ValueError:
            return False
        return seen > limit if op == "Gt" else seen < limit
    return False


def why_not(pod: PodInfo, node: NodeInfo, room: Resources) -> str | None:
    """Why ``node`` cannot take ``pod`` with ``room`` left, or ``None`` when it can."""
    if not node.ready:
        return "NotReady"
    if node.unschedulable and not tolerates(pod.tolerations, {
            "key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return "cordoned"
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                pod.tolerations, taint):
            return f"untolerated taint {taint.get('key')}={taint.get('value', '')}"
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return "nodeSelector does not match"
    if pod.affinity_terms and not any(
            t and all(matches_expression(e, node.labels) for e in t) for t in pod.affinity_terms):
        return "required node affinity does not match"
    return pod.requests.fits_in(room)


def usage(pods: Sequence[PodInfo]) -> dict[str, Resources]:
    """What the pods bound to each node request (finished pods take nothing)."""
    out: dict[str, Resources] = {}
    for pod in pods:
        if pod.node and pod.phase not in ("Succeeded", "Failed"):
            out[pod.node] = out.get(pod.node, Resources()) + pod.requests
    return out


def _score(used: Resources, alloc: Resources) -> float:
    parts = [u / a for u, a in ((used.cpu, alloc.cpu), (used.memory, alloc.memory))
             if a not in (0.0, float("inf"))]
    return max(parts, default=0.0)


def plan_drain(source: str, nodes: Sequence[NodeInfo], pods: Sequence[PodInfo], *,
               targets: Sequence[str] = (), selector: str | None = None) -> DrainPlan:
    """The plan to empty ``source`` (see the module docstring for the rules)."""
    by_name = {n.name: n for n in nodes}
    if source not in by_name:
        known = ", ".join(sorted(by_name)) or "none"
        raise PlanRejected(f"unknown node {source!r} (nodes: {known})")
    if len(by_name) < 2:
        raise PlanRejected(f"{source!r} is the only node: there is nowhere to move its pods")
    for t in targets:
        if t == source:
            raise PlanRejected(f"--to {t!r} is the node being drained; pick another node")
        if t not in by_name:
            raise PlanRejected(f"--to: unknown node {t!r}")
    wanted = parse_selector(selector)
    on_node = sorted((p for p in pods if p.node == source), key=lambda p: p.key)
    chosen = [p for p in on_node if selector_matches(wanted, p.labels)]
    if wanted and not chosen:
        raise PlanRejected(f"--selector {selector!r} matches no pod on node {source!r}")
    candidates = [by_name[t] for t in dict.fromkeys(targets)] if targets else [
        n for n in sorted(nodes, key=lambda n: n.name) if n.name != source]
    used = usage(pods)
    planned = {n.name: used.get(n.name, Resources()) for n in candidates}
    moves: list[Move] = []
    left: list[Left] = []
    movable = []
    for pod in chosen:
        reason = why_left(pod)
        if reason is None:
            movable.append(pod)
        else:
            left.append(Left(pod, reason))
    # Largest first: big pods need the room most; small ones fill the gaps.
    for pod in sorted(movable, key=lambda p: (-p.requests.cpu, -p.requests.memory, p.key)):
        best: tuple[float, str] | None = None
        refusals: dict[str, str] = {}
        for node in candidates:
            room = node.allocatable.minus(planned[node.name])
            problem = why_not(pod, node, room)
            if problem is not None:
                refusals[node.name] = problem
                continue
            score = _score(planned[node.name] + pod.requests, node.allocatable)
            if best is None or (score, node.name) < best:
                best = (score, node.name)
        if best is None:
            detail = "; ".join(f"{n}: {why}" for n, why in sorted(refusals.items()))
            left.append(Left(pod, f"no target fits ({detail or 'no candidate nodes'})"))
            continue
        target = by_name[best[1]]
        planned[target.name] = planned[target.name] + pod.requests
        after = planned[target.name]
        why = (f"fits: {after.cpu:g}/{target.allocatable.cpu:g} cpu, "
               f"{after.memory / 2**30:.2f}/{target.allocatable.memory / 2**30:.2f}Gi after "
               f"placing; least allocated of {len(candidates) - len(refusals)} fitting")
        moves.append(Move(pod, target.name, why))
    moves.sort(key=lambda m: m.pod.key)
    left.sort(key=lambda x: x.pod.key)
    return DrainPlan(source, tuple(moves), tuple(left),
                     {n.name: (planned[n.name], n.allocatable) for n in candidates},
                     tuple(targets), selector or "")
