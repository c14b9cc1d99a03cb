"""What the workload controllers decide, as pure functions over stored objects.

Copied from kube-controller-manager (``pkg/controller``), rule for rule where the
simulator has the inputs:

- :func:`is_active`, :func:`is_running_and_ready`: ``IsPodActive`` and the StatefulSet's
  ``isRunningAndReady``;
- :func:`deletion_order`: ``ActivePodsWithRanks.Less``, the order a ReplicaSet deletes
  its surplus in (unassigned, phase, readiness, ``pod-deletion-cost``, doubled-up
  nodes, ready time and creation time compared on a logarithmic scale with the UID as
  tie-breaker, restarts);
- :func:`controller_ref`, :func:`owner_ref`: ``metav1.GetControllerOf``/``NewControllerRef``;
- :func:`pod_from_template`: ``GetPodFromTemplate`` (labels, annotations, finalizers,
  ``generateName: <owner>-``, the controller reference, the spec);
- :func:`template_hash`: ``ComputeHash`` + ``rand.SafeEncodeString`` (FNV-32a, over the
  template's canonical JSON rather than Go's ``%#v`` of the struct: same alphabet and
  shape, not the same value as a real cluster's).

Called by :mod:`drivers.sim.controllers`. Pure: time comes in as ``now``.
"""

from __future__ import annotations

import functools
import math
from datetime import datetime
from typing import Any

import orjson

from drivers.sim.objects import Obj, clone, condition, is_true, meta

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
TEMPLATE_HASH = "pod-template-hash"
_PHASE_ORDINAL = {"Pending": 0, "Unknown": 1, "Running": 2}
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's rand alphanums
_INT32 = (-(2**31), 2**31 - 1)


def parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def is_active(pod: Obj) -> bool:
    """Not Succeeded, not Failed, not being deleted (``controller.IsPodActive``)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and meta(pod).get("deletionTimestamp") is None


def is_running_and_ready(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and is_true(pod, "Ready")


def is_available(pod: Obj, min_ready_seconds: int, now: datetime) -> bool:
    """Ready for at least ``min_ready_seconds`` (``podutil.IsPodAvailable``)."""
    if not is_true(pod, "Ready"):
        return False
    if min_ready_seconds <= 0:
        return True
    since = parse_time((condition(pod, "Ready") or {}).get("lastTransitionTime"))
    return since is not None and (now - since).total_seconds() >= min_ready_seconds


def controller_ref(obj: Obj) -> Obj | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def owner_ref(owner: Obj) -> Obj:
    """The controller reference a controller puts on what it makes or adopts."""
    m = meta(owner)
    return {"apiVersion": owner.get("apiVersion", "apps/v1"), "kind": owner.get("kind"),
            "name": m["name"], "uid": m["uid"], "controller": True,
            "blockOwnerDeletion": True}


def pod_from_template(template: Obj, owner: Obj) -> Obj:
    """A new pod of ``owner`` (``controller.GetPodFromTemplate``), named by the server."""
    tmeta = template.get("metadata") or {}
    pod_meta: Obj = {"generateName": f"{meta(owner)['name']}-",
                     "ownerReferences": [owner_ref(owner)]}
    for field in ("labels", "annotations", "finalizers"):
        if tmeta.get(field):
            pod_meta[field] = clone({"v": tmeta[field]})["v"]
    return {"metadata": pod_meta, "spec": clone(template.get("spec") or {})}


def template_hash(template: Obj, collision_count: int = 0) -> str:
    data = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    if collision_count:
        data += collision_count.to_bytes(4, "little")
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[b % len(_SAFE)] for b in str(value).encode())


def deletion_cost(pod: Obj) -> int:
    """The ``pod-deletion-cost`` annotation; 0 when absent or not an int32, as the real
    helper's error is ignored by the ranking."""
    raw = (meta(pod).get("annotations") or {}).get(DELETION_COST)
    try:
        cost = int(str(raw))
    except ValueError:
        return 0
    return cost if _INT32[0] <= cost <= _INT32[1] else 0


def _restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return max((int(c.get("restartCount") or 0) for c in statuses), default=0)


def _ready_time(pod: Obj) -> datetime | None:
    if not is_true(pod, "Ready"):
        return None
    return parse_time((condition(pod, "Ready") or {}).get("lastTransitionTime"))


def _log_rank(at: datetime, now: datetime) -> int:
    nanos = (now - at).total_seconds() * 1e9
    return int(math.log2(nanos)) if nanos > 0 else -1


def _newer_first(a: datetime | None, b: datetime | None, now: datetime,
                 uids: tuple[str, str]) -> bool | None:
    """Steps 6 and 8 of ``Less`` with LogarithmicScaleDown (on by default): ``None`` when
    the times are equal (the next rule decides)."""
    if a == b:
        return None
    if a is None or b is None:  # afterOrZero: a zero time comes first
        return a is None
    diff = _log_rank(a, now) - _log_rank(b, now)
    if diff == 0:
        return uids[0] < uids[1]
    return diff < 0


def _less(a: Obj, b: Obj, ranks: dict[str, int], now: datetime) -> bool:
    """``ActivePodsWithRanks.Less``: True when ``a`` should be deleted before ``b``."""
    node_a, node_b = (str((p.get("spec") or {}).get("nodeName") or "") for p in (a, b))
    if node_a != node_b and (not node_a or not node_b):
        return not node_a
    phase_a, phase_b = (_PHASE_ORDINAL.get((p.get("status") or {}).get("phase") or "", 0)
                        for p in (a, b))
    if phase_a != phase_b:
        return phase_a < phase_b
    if is_true(a, "Ready") != is_true(b, "Ready"):
        return not is_true(a, "Ready")
    if deletion_cost(a) != deletion_cost(b):
        return deletion_cost(a) < deletion_cost(b)
    uid_a, uid_b = str(meta(a).get("uid")), str(meta(b).get("uid"))
    if ranks.get(uid_a, 0) != ranks.get(uid_b, 0):
        return ranks.get(uid_a, 0) > ranks.get(uid_b, 0)
    if is_true(a, "Ready") and is_true(b, "Ready"):
        newer = _newer_first(_ready_time(a), _ready_time(b), now, (uid_a, uid_b))
        if newer is not None:
            return newer
    if _restarts(a) != _restarts(b):
        return _restarts(a) > _restarts(b)
    newer = _newer_first(parse_time(meta(a).get("creationTimestamp")),
                         parse_time(meta(b).get("creationTimestamp")), now, (uid_a, uid_b))
    return bool(newer)


def deletion_order(pods: list[Obj], related: list[Obj], now: datetime) -> list[Obj]:
    """``pods`` sorted so the ones to delete first come first.

    The rank of a pod is how many active ``related`` pods (those of every ReplicaSet of
    the same Deployment) share its node (``getPodsRankedByRelatedPodsOnSameNode``). The
    real sort is Go's ``sort.Sort`` over the informer's order; for the few pods of a test
    that is an insertion sort, stable, and here the input is ordered by name, so pods the
    rules cannot tell apart go in name order (on a real cluster: the informer's order).
    """
    on_node: dict[str, int] = {}
    for pod in related:
        if is_active(pod):
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            on_node[node] = on_node.get(node, 0) + 1
    ranks = {str(meta(p).get("uid")): on_node.get(
        str((p.get("spec") or {}).get("nodeName") or ""), 0) for p in pods}

    def compare(a: Any, b: Any) -> int:
        if _less(a, b, ranks, now):
            return -1
        return 1 if _less(b, a, ranks, now) else 0

    return sorted(pods, key=functools.cmp_to_key(compare))
