"""The restore gate's admission decisions: which pods to ask about, and the answer (pure).

A StatefulSet's pod that a migration deleted comes back under the same name, created by
the controller. The webhook (``controlplane.api.webhook``) asks
:func:`needs_gate_lookup` whether a review concerns such a pod, looks the pod up in the
store, and answers with :func:`admission_response`: always allowed, with a JSONPatch that
adds :data:`~controlplane.machines.contract.protocol.RESTORE_GATE` when a migration awaits
the pod. A scheduling gate can only be set at creation, hence a webhook; the migration
later narrows the gated pod's scheduling and removes the gate (KEP-3838).

No I/O, no clock: the same review gives the same response.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from controlplane.machines.contract.protocol import RESTORE_GATE

API_VERSION = "admission.k8s.io/v1"
#: The audit annotation key (the API server prefixes it with the webhook's name).
AUDIT_KEY = "restore-gate"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_statefulset_controller(ref: object) -> bool:
    ref = _mapping(ref)
    return (ref.get("controller") is True and ref.get("kind") == "StatefulSet"
            and str(ref.get("apiVersion", "")).startswith("apps/"))


def needs_gate_lookup(review: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(namespace, name)`` of the pod a review CREATES when a StatefulSet controls it,
    else ``None`` (another operation, another resource, another owner, or no name yet).

    The name is the object's, else the request's (``request.name``); a StatefulSet always
    names its pods, so a pod with only ``generateName`` is not a successor.
    """
    request = _mapping(review.get("request"))
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return None
    kind = _mapping(request.get("kind"))
    if (kind.get("group", ""), kind.get("kind")) != ("", "Pod"):
        return None
    meta = _mapping(_mapping(request.get("object")).get("metadata"))
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list) or not any(_is_statefulset_controller(r) for r in refs):
        return None
    namespace = meta.get("namespace") or request.get("namespace")
    name = meta.get("name") or request.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        return None
    return namespace, name


def gate_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch that adds the restore gate to ``pod``: a new ``schedulingGates``
    list, or one more entry in the existing one; nothing if the gate is already there."""
    spec = _mapping(pod.get("spec"))
    gates = spec.get("schedulingGates")
    entry = {"name": RESTORE_GATE}
    if not isinstance(gates, list) or not gates:
        # Absent, null or empty: "add" on /spec/schedulingGates sets the whole list.
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [entry]}]
    if any(_mapping(g).get("name") == RESTORE_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": entry}]


def admission_response(review: Mapping[str, Any], operation: str | None, *,
                       warning: str | None = None) -> dict[str, Any]:
    """The AdmissionReview v1 answer to ``review``: always ``allowed``; when ``operation``
    (a migration id) awaits the pod, a base64 JSONPatch adding the restore gate, an audit
    annotation and a warning naming that operation. ``warning`` is added as given (the
    webhook says so when it failed open)."""
    request = _mapping(review.get("request"))
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    warnings = [] if warning is None else [warning]
    pod = _mapping(request.get("object"))
    if operation is not None:
        if _mapping(pod.get("spec")).get("nodeName"):
            # A pod already bound cannot carry a scheduling gate: the API server would
            # refuse it, and this webhook never refuses. The migration sees no gate and
            # fails loudly (SuccessorNotGated) instead.
            warnings.append(f"{RESTORE_GATE}: not gated for migration {operation}: "
                            "spec.nodeName is set")
        else:
            patch = gate_patch(pod)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(
                    json.dumps(patch, separators=(",", ":")).encode()).decode()
            response["auditAnnotations"] = {AUDIT_KEY: f"held for migration {operation}"}
            warnings.append(f"{RESTORE_GATE}: held by migration {operation}, which restores "
                            "it and removes the gate")
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
