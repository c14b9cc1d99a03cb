"""Request bodies the action handlers send, built from action params. Pure.

- :func:`restore_pod`: the pod of a ``CreatePod``: the template's labels and
  annotations with the action's merged over them, the template's spec with REQUIRED node
  affinity to ``node`` on ``kubernetes.io/hostname`` — never ``nodeName``, so the
  scheduler still applies capacity, cordons and taints. A saved spec pinned to the old
  node (a hostname ``nodeSelector``, hostname expressions or ``metadata.name`` fields in
  its required terms) is unpinned first, or the pod could never leave that node.
- :func:`annotation_patch`: a strategic merge patch of annotations that carries
  ``metadata.uid``: the API server refuses (422, ``metadata.uid`` is immutable) to apply
  it to a pod recreated under the same name with another UID.
- :func:`claim_patch`: the merge patch a ``ClaimPod`` sends to a controller's gated pod:
  the restore annotations, the required node affinity narrowed to the target (only
  appended to, the one change a gated pod accepts, KEP-3838) and the gate removed, with
  ``metadata.uid`` and ``resourceVersion`` as preconditions.
- :func:`event_body` / :func:`event_name`: a core/v1 Event whose name is derived from the
  action key, so performing the action twice is ``AlreadyExists``, i.e. done.

Called by :mod:`drivers.kube.handlers`.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from controlplane.machines.contract import protocol
from drivers.kube.client import KubeObject

HOSTNAME = "kubernetes.io/hostname"


def require_node(spec: KubeObject, node: str) -> KubeObject:
    """``spec`` with required node affinity to ``node`` ANDed into every term."""
    out = copy.deepcopy(spec)
    out.pop("nodeName", None)
    selector = out.get("nodeSelector")
    if isinstance(selector, dict):
        selector.pop(HOSTNAME, None)
        if not selector:
            out.pop("nodeSelector")
    affinity = out.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    pin = {"key": HOSTNAME, "operator": "In", "values": [node]}
    terms: list[Any] = []
    for term in required.get("nodeSelectorTerms") or []:
        if not isinstance(term, dict):
            continue
        exprs = [e for e in term.get("matchExpressions") or []
                 if isinstance(e, dict) and e.get("key") != HOSTNAME]
        fields = [f for f in term.get("matchFields") or []
                  if isinstance(f, dict) and f.get("key") != "metadata.name"]
        kept: KubeObject = {"matchExpressions": [*exprs, pin]}
        if fields:
            kept["matchFields"] = fields
        terms.append(kept)
    required["nodeSelectorTerms"] = terms or [{"matchExpressions": [pin]}]
    return out


def restore_pod(*, namespace: str, name: str, template: Mapping[str, Any], node: str | None,
                annotations: Mapping[str, str], labels: Mapping[str, str],
                images: Mapping[str, str] | None = None) -> KubeObject:
    meta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
    spec = template.get("spec")
    if not isinstance(spec, dict):
        raise ValueError("the pod template has no spec")
    body_spec = require_node(spec, node) if node else {
        k: copy.deepcopy(v) for k, v in spec.items() if k != "nodeName"}
    merged_labels = {**_strings((meta or {}).get("labels")), **labels}
    # A saved template may carry the source's protocol annotations (a capture request, a
    # report, a restore-failure): they describe the old pod, never the new one.
    inherited = {k: v for k, v in _strings((meta or {}).get("annotations")).items()
                 if not k.startswith(protocol.PREFIX)}
    merged_annotations = {**inherited, **annotations}
    if images:
        body_spec = {**body_spec, "containers": with_images(body_spec.get("containers"), images)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": merged_labels,
                         "annotations": merged_annotations},
            "spec": body_spec}


def with_images(containers: object, images: Mapping[str, str]) -> list[Any]:
    """The pod's ``containers`` with the named ones' ``image`` replaced (a checkpoint image
    the runtime restores from); a name the pod lacks is an error, not silently dropped."""
    listed = [copy.deepcopy(c) for c in containers or [] if isinstance(c, dict)] \
        if isinstance(containers, list) else []
    names = {str(c.get("name")) for c in listed}
    missing = sorted(set(images) - names)
    if missing:
        raise ValueError(f"the checkpoint names container(s) {', '.join(missing)} the pod "
                         f"does not have (it has {', '.join(sorted(names)) or 'none'})")
    for c in listed:
        if c.get("name") in images:
            c["image"] = images[str(c["name"])]
    return listed


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def annotation_patch(uid: str, changes: Mapping[str, str | None],
                     labels: Mapping[str, str] | None = None) -> KubeObject:
    """Set (``str``) or remove (``None``) annotations, and set ``labels``, only on the pod
    with ``uid``."""
    meta: KubeObject = {"uid": uid, "annotations": dict(changes)}
    if labels:
        meta["labels"] = dict(labels)
    return {"metadata": meta}


def claim_patch(pod: Mapping[str, Any], *, node: str | None, gate: str,
                annotations: Mapping[str, str],
                images: Mapping[str, str] | None = None) -> KubeObject:
    """The merge patch that claims gated ``pod`` (as read) for a restore on ``node``."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    gates = [g for g in spec.get("schedulingGates") or []
             if isinstance(g, dict) and g.get("name") != gate]
    patch_spec: KubeObject = {"schedulingGates": gates}
    if node:
        pin = {"key": HOSTNAME, "operator": "In", "values": [node]}
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), pin]}
                 for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]
        patch_spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms or [{"matchExpressions": [pin]}]}}}
    if images:  # a merge patch replaces the list: the whole list, as read, images changed
        patch_spec["containers"] = with_images(spec.get("containers"), images)
    return {"metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
                         "annotations": dict(annotations)},
            "spec": patch_spec}


def event_name(object_name: str, action_key: str) -> str:
    """``<object>.<16 hex of sha256(key)>``, within the 253 characters a name may have."""
    digest = hashlib.sha256(action_key.encode()).hexdigest()[:16]
    return f"{object_name[:253 - 17].rstrip('.-')}.{digest}"


def event_body(*, namespace: str, name: str, involved: Mapping[str, Any], type_: str,
               reason: str, message: str, component: str, at: datetime) -> KubeObject:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    target: KubeObject = {"apiVersion": "v1", "kind": str(involved.get("kind") or "Pod"),
                          "name": str(involved.get("name") or ""), "namespace": namespace}
    if involved.get("uid"):
        target["uid"] = str(involved["uid"])
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": target, "type": type_, "reason": reason,
            "message": message[:1024], "source": {"component": component},
            "reportingComponent": component, "reportingInstance": component,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
