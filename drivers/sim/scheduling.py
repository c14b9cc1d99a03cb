"""The simulated scheduler's decision: which node may run a pod, and why not the others.

A node is feasible when it is ``Ready``, not cordoned (``spec.unschedulable``, unless the
pod tolerates ``node.kubernetes.io/unschedulable``), every ``NoSchedule``/``NoExecute``
taint is tolerated, ``nodeSelector`` and REQUIRED node affinity match (terms ORed,
expressions ANDed; ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``;
``matchFields`` on ``metadata.name``) and the pod's CPU/memory requests fit in what the
node's running pods leave of its allocatable (plus the ``pods`` count). Among feasible
nodes the least allocated wins (ties by name), so placement is deterministic. When none
fits, the message reads like the real scheduler's ("0/3 nodes are available: ...").

Called by :mod:`drivers.sim.kubelet`. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from controlplane.machines.drain.planning import matches_expression, tolerates
from drivers.sim.objects import Obj, is_true, meta, quantity

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def pod_requests(pod: Obj) -> dict[str, float]:
    """CPU (cores) and memory (bytes) the pod requests; limits stand in for requests."""
    total = {"cpu": 0.0, "memory": 0.0}
    spec = pod.get("spec") or {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        for key in total:
            value = (res.get("requests") or {}).get(key, (res.get("limits") or {}).get(key))
            if value is not None:
                total[key] += quantity(value)
    for c in spec.get("initContainers") or []:
        requests = (c.get("resources") or {}).get("requests") or {}
        for key in total:
            if key in requests:
                total[key] = max(total[key], quantity(requests[key]))
    return total


def allocatable(node: Obj) -> dict[str, float]:
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    return {key: quantity(alloc[key]) if key in alloc else float("inf")
            for key in ("cpu", "memory", "pods")}


def matches_affinity(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = meta(node).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    fields = {"metadata.name": str(meta(node).get("name", ""))}
    for term in required.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        field_exprs = term.get("matchFields") or []
        if not exprs and not field_exprs:
            continue  # an empty term matches nothing
        if all(matches_expression(e, labels) for e in exprs) and \
                all(matches_expression(e, fields) for e in field_exprs):
            return True
    return False


def why_not(pod: Obj, node: Obj, used: Mapping[str, float]) -> str | None:
    """Why ``node`` cannot take ``pod`` given what its pods already use, or ``None``."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    if not is_true(node, "Ready"):
        return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    spec = node.get("spec") or {}
    if spec.get("unschedulable") and not tolerates(
            tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return "node(s) were unschedulable"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations,
                                                                                 taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    if not matches_affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    alloc = allocatable(node)
    want = pod_requests(pod)
    if used.get("pods", 0) + 1 > alloc["pods"]:
        return "Too many pods"
    for key, label in (("cpu", "Insufficient cpu"), ("memory", "Insufficient memory")):
        if want[key] > 0 and used.get(key, 0) + want[key] > alloc[key]:
            return label
    return None


def counted_node(pod: Obj) -> str | None:
    """The node whose capacity ``pod`` takes: bound there and not finished (else None)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    return str(node)


def usage(pods: Iterable[Obj]) -> dict[str, dict[str, float]]:
    """Per node: CPU, memory and pod count taken by pods bound there and not finished."""
    out: dict[str, dict[str, float]] = {}
    for pod in pods:
        node = counted_node(pod)
        if node is None:
            continue
        slot = out.setdefault(node, {"cpu": 0.0, "memory": 0.0, "pods": 0.0})
        for key, value in pod_requests(pod).items():
            slot[key] += value
        slot["pods"] += 1
    return out


def choose(pod: Obj, nodes: Sequence[Obj], used: Mapping[str, Mapping[str, float]]
           ) -> tuple[str | None, str]:
    """The node for ``pod`` (least allocated, then by name) or ``None`` and the reasons."""
    reasons: Counter[str] = Counter()
    best: tuple[float, str] | None = None
    for node in nodes:
        name = str(meta(node).get("name"))
        slot = used.get(name, {})
        problem = why_not(pod, node, slot)
        if problem is not None:
            reasons[problem] += 1
            continue
        alloc = allocatable(node)
        score = sum(slot.get(k, 0.0) / alloc[k] for k in ("cpu", "memory")
                    if alloc[k] not in (0.0, float("inf")))
        if best is None or (score, name) < best:
            best = (score, name)
    if best is not None:
        return best[1], ""
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}." if detail else \
        "0/0 nodes are available."
