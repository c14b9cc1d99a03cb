"""Per-kind rules of the simulated API server, like the real server's registry strategies.

- :func:`prepare_create`: validate a new object and fill defaults (a pod starts
  ``Pending`` with a default grace period; a node gets a ``Ready`` status).
- :func:`prepare_update`: merge an update into the stored object: the main resource
  ignores ``status``, the ``status`` subresource ignores the spec (not labels,
  annotations and finalizers, as on a real server); ``uid``,
  ``name``, ``creationTimestamp`` and ``deletionTimestamp`` are immutable (422), a pod's
  spec may change only where Kubernetes allows it (images, tolerations, deadlines,
  scheduling gates), never ``nodeName`` (binding sets it).
- the workload kinds (apps/v1 and claims) follow :mod:`drivers.sim.workloads`; custom
  resources and their definitions, :mod:`drivers.sim.custom`.
- :func:`deletion_grace`: how long a DELETE waits before the object may go: pods bound
  to a node get their grace period (the simulated kubelet stops them), everything else
  goes at once.

Called by :mod:`drivers.sim.store`. Pure.
"""

from __future__ import annotations

from typing import Any

from drivers.sim import custom, validation, workloads
from drivers.sim.objects import (
    CRDS,
    ApiError,
    Obj,
    Resource,
    clone,
    invalid,
    meta,
    quantity,
    timestamp,
)

DEFAULT_GRACE_SECONDS = 30
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")


def _string_map(resource: Resource, name: str, obj: Obj, field: str) -> None:
    value = meta(obj).get(field)
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid(resource, name, f"metadata.{field}", "must map strings to strings")


def validate_meta(resource: Resource, obj: Obj, *, check_name: bool = False) -> None:
    name = str(meta(obj).get("name", ""))
    _string_map(resource, name, obj, "labels")
    _string_map(resource, name, obj, "annotations")
    finalizers = meta(obj).get("finalizers")
    if finalizers is not None and (not isinstance(finalizers, list)
                                   or not all(isinstance(f, str) for f in finalizers)):
        raise invalid(resource, name, "metadata.finalizers", "must be a list of strings")
    causes = validation.metadata_errors(resource, meta(obj), check_name=check_name)
    if causes:
        raise validation.invalid_object(resource, name, causes)


def prepare_create(resource: Resource, obj: Obj) -> None:
    """Validate ``obj`` (its metadata already named) and fill the kind's defaults."""
    validate_meta(resource, obj, check_name=True)
    obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
    name = str(meta(obj)["name"])
    if resource.custom:
        custom.prepare_create(resource, obj)
    elif resource.plural == CRDS:
        custom.check_crd(obj)
        obj["status"] = custom.accepted_status(obj)
    elif resource.group or resource.plural == "persistentvolumeclaims":
        workloads.prepare_create(resource, obj)
    elif resource.plural == "pods":
        _prepare_pod(resource, name, obj)
    elif resource.plural == "nodes":
        obj.setdefault("spec", {})
        status = obj.setdefault("status", {})
        status.setdefault("conditions", [{"type": "Ready", "status": "True",
                                          "reason": "KubeletReady",
                                          "lastTransitionTime": timestamp()}])
    elif resource.plural == "namespaces":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
    elif resource.plural == "events":
        involved = obj.get("involvedObject")
        if not isinstance(involved, dict):
            raise invalid(resource, name, "involvedObject", "Required value")
        namespace = meta(obj).get("namespace")
        if involved.get("namespace", namespace) != namespace:
            raise invalid(resource, name, "involvedObject.namespace",
                          "does not match event.namespace")


def _prepare_pod(resource: Resource, name: str, obj: Obj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise invalid(resource, name, "spec", "Required value")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid(resource, name, "spec.containers", "Required value")
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            raise invalid(resource, name, f"spec.containers[{i}]", "name and image are required")
        for kind in ("requests", "limits"):
            for key, value in ((c.get("resources") or {}).get(kind) or {}).items():
                try:
                    quantity(value)
                except ValueError:
                    raise invalid(resource, name, f"spec.containers[{i}].resources.{kind}.{key}",
                                  f"invalid quantity {value!r}") from None
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def prepare_update(resource: Resource, old: Obj, new: Obj, *, subresource: str | None) -> Obj:
    """The object to store when ``new`` replaces ``old`` (both full objects)."""
    name = str(meta(old)["name"])
    old_meta, new_meta = meta(old), meta(new)
    for field in ("uid", "name", "namespace", "creationTimestamp"):
        seen = new_meta.get(field)
        if seen not in (None, "") and seen != old_meta.get(field):
            raise invalid(resource, name, f"metadata.{field}",
                          f'Invalid value: "{seen}": field is immutable')
    if subresource == "status":
        # As on a real server, a status write carries metadata too (labels, annotations,
        # finalizers); only the spec is the main resource's alone.
        validate_meta(resource, new)
        out = clone(old)
        out["status"] = clone(new.get("status") or {})
        for field in ("labels", "annotations", "finalizers"):
            if new_meta.get(field):
                meta(out)[field] = clone(new_meta)[field]
            else:
                meta(out).pop(field, None)
        return out
    validate_meta(resource, new)
    out = clone(new)
    out["kind"], out["apiVersion"] = resource.kind, resource.api_version
    for field in ("uid", "name", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation"):
        if field in old_meta:
            meta(out)[field] = old_meta[field]
        else:
            meta(out).pop(field, None)
    if old_meta.get("namespace"):
        meta(out)["namespace"] = old_meta["namespace"]
    if resource.has_status:
        if "status" in old:
            out["status"] = clone(old["status"])
        else:
            out.pop("status", None)
    if resource.plural == "pods":
        _check_pod_spec(resource, name, old.get("spec") or {}, out.get("spec") or {})
    elif resource.custom:
        custom.prepare_update(old, out)
    elif resource.plural == CRDS:
        custom.check_crd(out)
        out["status"] = custom.accepted_status(out)
    elif resource.group or resource.plural == "persistentvolumeclaims":
        workloads.prepare_update(resource, old, out)
    return out


def _check_pod_spec(resource: Resource, name: str, old: Obj, new: Obj) -> None:
    # ``nodeName`` included: an update never binds a pod, even from empty (pods/binding does).
    def frozen(spec: Obj) -> Obj:
        out = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC}
        out["containers"] = [{k: v for k, v in c.items() if k != "image"}
                             for c in spec.get("containers") or [] if isinstance(c, dict)]
        return out

    gates = [g.get("name") for g in old.get("schedulingGates") or [] if isinstance(g, dict)]
    added = [(i, g.get("name")) for i, g in enumerate(new.get("schedulingGates") or [])
             if isinstance(g, dict) and g.get("name") not in gates]
    if added:
        i, gate = added[0]
        raise validation.invalid_object(resource, name, [(
            f"spec.schedulingGates[{i}].name", f"Forbidden: only deletion is allowed, but "
            f"found new scheduling gate '{gate}'", "FieldValueForbidden")])
    if new.get("schedulingGates") == []:
        del new["schedulingGates"]  # stored as absent, as the real server's omitempty does
    if gates:  # KEP-3838: a gated pod's scheduling constraints may be narrowed
        problem = _widened(old, new)
        if problem is not None:
            raise validation.invalid_object(resource, name, [
                (*problem, "FieldValueInvalid")])
        old = {k: v for k, v in old.items() if k not in ("affinity", "nodeSelector")}
        new = {k: v for k, v in new.items() if k not in ("affinity", "nodeSelector")}
    if frozen(old) != frozen(new):
        raise validation.invalid_object(resource, name, [(
            "spec", "Forbidden: pod updates may not change fields other than "
            "`spec.containers[*].image`,`spec.initContainers[*].image`,"
            "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
            "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it "
            "was previously negative)", "FieldValueForbidden")])


def _widened(old: Obj, new: Obj) -> tuple[str, str] | None:
    """Why a gated pod's new ``nodeSelector``/required node affinity is not a narrowing of
    the old (the real server's rule: keys only added, terms only extended), or ``None``."""
    before, after = old.get("nodeSelector") or {}, new.get("nodeSelector") or {}
    if any(after.get(k) != v for k, v in before.items()):
        return ("spec.nodeSelector", "Invalid value: only additions are allowed "
                "(no mutations or deletions)")

    def terms(spec: Obj) -> list[Any]:
        node = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        return list(required.get("nodeSelectorTerms") or [])

    was, now = terms(old), terms(new)
    if not was:
        return None
    field = ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
             "nodeSelectorTerms")
    if len(was) != len(now):
        return (field, "Invalid value: no additions/deletions to non-empty NodeSelectorTerms "
                "list are allowed")
    for i, (a, b) in enumerate(zip(was, now, strict=True)):
        exprs = list((a or {}).get("matchExpressions") or [])
        if list((b or {}).get("matchExpressions") or [])[:len(exprs)] != exprs:
            return (f"{field}[{i}]", "Invalid value: only additions to matchExpressions "
                    "are allowed")
    return None


def deletion_grace(resource: Resource, obj: Obj, requested: int | None) -> int:
    """Seconds a DELETE leaves the object terminating before it may be removed."""
    if resource.plural != "pods" or not (obj.get("spec") or {}).get("nodeName"):
        return 0
    if requested is not None:
        if requested < 0:
            raise ApiError(422, "gracePeriodSeconds must be >= 0", reason="Invalid")
        return requested
    grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    return int(grace) if isinstance(grace, int) else DEFAULT_GRACE_SECONDS
