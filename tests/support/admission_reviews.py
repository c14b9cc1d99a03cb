"""AdmissionReview v1 requests as the API server sends them to the restore gate's webhook:
:func:`review` builds one for a pod in ``prod`` (by default ``db-0``, created, owned by
the StatefulSet :data:`STS_REF`). Used by ``tests/webhook/test_successor_gate.py`` (the
pure decisions) and ``tests/webhook/test_webhook_app.py`` (the HTTP surface).
"""

from __future__ import annotations

from typing import Any

STS_REF = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u-sts",
           "controller": True, "blockOwnerDeletion": True}


def review(*, operation: str = "CREATE", owners: list[dict[str, Any]] | None = None,
           name: str | None = "db-0", request_name: str | None = None,
           spec: dict[str, Any] | None = None, kind: str = "Pod") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "prod",
                            "ownerReferences": [STS_REF] if owners is None else owners}
    if name is not None:
        meta["name"] = name
    request: dict[str, Any] = {
        "uid": "req-1", "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "prod", "operation": operation,
        "object": {"apiVersion": "v1", "kind": kind, "metadata": meta,
                   "spec": spec if spec is not None else {"containers": [{"name": "c"}]}}}
    if request_name is not None:
        request["name"] = request_name
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
