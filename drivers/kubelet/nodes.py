"""The role's nodes as the API server should show them: bodies and patches. Pure.

- :func:`node_body`: what the role POSTs to register a node (labels
  ``kubernetes.io/hostname``/``os``/``arch``, capacity = allocatable, an ``InternalIP``
  of ``10.0.0.<index>``, ``Ready``), like a kubelet's self-registration;
- :func:`status_patch`: the merge patch of ``nodes/NAME/status`` that (re)states
  ``Ready=True`` with a fresh ``lastHeartbeatTime`` (transition time kept while Ready);
- :func:`untaint_patch`: the merge patch that removes ``node.kubernetes.io/not-ready``
  (the real API server's ``TaintNodesByCondition`` admission adds it to every new node;
  without a node lifecycle controller nobody else takes it off), fenced by
  ``resourceVersion`` so a concurrent taint or cordon is not lost;
- :func:`healthy`: Ready and without that taint (what the ready line waits for).

Called by :mod:`drivers.kubelet.role`. Time comes in as an argument.
"""

from __future__ import annotations

from drivers.kube.client import KubeObject
from drivers.kubelet.options import RoleOptions
from drivers.sim import nodestatus
from drivers.sim.objects import condition, meta

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _status(name: str, index: int, options: RoleOptions) -> KubeObject:
    return nodestatus.node_status(name, index, cpu=options.cpu, memory=options.memory,
                                  pods=options.pods)


def node_body(name: str, index: int, options: RoleOptions, *, now: str) -> KubeObject:
    """The Node the role creates for ``name`` (``index``: its 1-based place in --nodes):
    the simulator's own node (:func:`drivers.sim.nodestatus.node_object`)."""
    return nodestatus.node_object(name, index, cpu=options.cpu, memory=options.memory,
                                  pods=options.pods, now=now)


def status_patch(node: KubeObject, index: int, options: RoleOptions, *, now: str,
                 ) -> KubeObject:
    """Merge patch of ``nodes/NAME/status``: Ready now, sizes and addresses restated."""
    name = str(meta(node).get("name"))
    before = condition(node, "Ready")
    since = now
    if before is not None and before.get("status") == "True":
        since = str(before.get("lastTransitionTime") or now)
    others = [c for c in (node.get("status") or {}).get("conditions") or []
              if isinstance(c, dict) and c.get("type") != "Ready"]
    return {"status": {**_status(name, index, options),
                       "conditions": [*others, nodestatus.ready_condition(now, since)]}}


def has_not_ready_taint(node: KubeObject) -> bool:
    return any(t.get("key") == NOT_READY_TAINT
               for t in (node.get("spec") or {}).get("taints") or [])


def untaint_patch(node: KubeObject) -> KubeObject:
    """Merge patch dropping the not-ready taint, valid only at the version seen."""
    kept = [t for t in (node.get("spec") or {}).get("taints") or []
            if t.get("key") != NOT_READY_TAINT]
    return {"metadata": {"resourceVersion": meta(node).get("resourceVersion")},
            "spec": {"taints": kept or None}}


def healthy(node: KubeObject | None) -> bool:
    """Registered, Ready and without the not-ready taint."""
    if node is None:
        return False
    ready = condition(node, "Ready")
    return ready is not None and ready.get("status") == "True" and \
        not has_not_ready_taint(node)
