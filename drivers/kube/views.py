"""Kubernetes objects (parsed JSON) narrowed to the core's typed views. Pure.

:func:`pod_view` keeps what machines decide on: identity (namespace, name, UID), the
node it is bound to, phase, readiness (condition ``Ready``), whether it is terminating
(``deletionTimestamp``), annotations, labels and resourceVersion. :func:`node_view`:
ready (condition ``Ready`` is ``True``), unschedulable (cordoned), labels.

Called by :mod:`drivers.kube.observer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.engine.observation import NodeView, PodView

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def condition_true(obj: Mapping[str, Any], type_: str) -> bool:
    for c in _mapping(obj.get("status")).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c.get("status") == "True"
    return False


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    phase = str(_mapping(obj.get("status")).get("phase") or "Pending")
    node = spec.get("nodeName")
    return PodView(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""), node=str(node) if node else None,
        phase=phase if phase in PHASES else "Unknown", ready=condition_true(obj, "Ready"),
        deleting=meta.get("deletionTimestamp") is not None,
        annotations=_strings(meta.get("annotations")), labels=_strings(meta.get("labels")),
        resource_version=str(meta.get("resourceVersion") or ""),
        controller=controller_ref(meta),
        gates=tuple(str(g.get("name")) for g in spec.get("schedulingGates") or []
                    if isinstance(g, Mapping)),
    )


def controller_ref(meta: Mapping[str, Any]) -> str:
    """``Kind/name`` of the ``ownerReferences`` entry with ``controller: true``, or ``""``."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"{ref.get('kind') or '?'}/{ref.get('name') or '?'}"
    return ""


def node_view(obj: Mapping[str, Any]) -> NodeView:
    meta = _mapping(obj.get("metadata"))
    return NodeView(name=str(meta.get("name") or ""), ready=condition_true(obj, "Ready"),
                    unschedulable=bool(_mapping(obj.get("spec")).get("unschedulable")),
                    labels=_strings(meta.get("labels")),
                    runtime=str(_mapping(_mapping(obj.get("status")).get("nodeInfo"))
                                .get("containerRuntimeVersion") or ""))
