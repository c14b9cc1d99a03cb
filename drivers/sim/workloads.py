"""The registry rules of the workload kinds: ``apps/v1`` Deployments, ReplicaSets and
StatefulSets, and core/v1 PersistentVolumeClaims.

- :func:`prepare_create`: the kind's defaults (``replicas: 1``, the update strategy, a
  StatefulSet's ``podManagementPolicy: OrderedReady``...), ``metadata.generation: 1``, an
  empty status (a claim starts ``Pending``) and the real server's validation: a selector is
  required and must match the template's labels, ``replicas >= 0``, a template's
  ``restartPolicy`` is ``Always``, in apimachinery's words (``422 Invalid``);
- :func:`prepare_update`: the same validation, an immutable selector (and a StatefulSet's
  spec beyond the fields it lets change), and ``metadata.generation`` bumped when the spec
  changes, as the apps strategies do (a status write never bumps it).

Called by :mod:`drivers.sim.strategies`. Pure.
"""

from __future__ import annotations

from typing import Any

from drivers.sim import validation
from drivers.sim.objects import Obj, Resource, meta
from drivers.sim.selectors import label_selector_matches

DEFAULT_GRACE_SECONDS = 30
# What apps/v1 ValidateStatefulSetUpdate lets change; anything else is Forbidden.
_STATEFULSET_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy",
                        "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def prepare_create(resource: Resource, obj: Obj) -> None:
    """Default and validate a new workload or claim (metadata already checked)."""
    if resource.plural == "persistentvolumeclaims":
        _check_claim(resource, obj)
        obj["spec"].setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}
        return
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise validation.invalid_object(resource, _name(obj), [
            ("spec", "Required value", "FieldValueRequired")])
    _default(resource.plural, spec)
    _check(resource, obj)
    meta(obj)["generation"] = 1
    obj["status"] = {}


def prepare_update(resource: Resource, old: Obj, out: Obj) -> None:
    """Validate ``out`` replacing ``old`` (main resource) and bump its generation."""
    if resource.plural == "persistentvolumeclaims":
        _check_claim(resource, out)
        return
    spec = out.setdefault("spec", {})
    before = old.get("spec") or {}
    if isinstance(spec, dict):
        _default(resource.plural, spec)
    _check(resource, out)
    causes: list[validation.Cause] = []
    if spec.get("selector") != before.get("selector"):
        causes.append(("spec.selector", f"Invalid value: {_go_selector(spec.get('selector'))}"
                       ": field is immutable", "FieldValueInvalid"))
    if resource.plural == "statefulsets" and (
            {k: v for k, v in spec.items() if k not in _STATEFULSET_MUTABLE}
            != {k: v for k, v in before.items() if k not in _STATEFULSET_MUTABLE}):
        causes.append(("spec", "Forbidden: updates to statefulset spec for fields other than "
                       "'replicas', 'ordinals', 'template', 'updateStrategy', "
                       "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are "
                       "forbidden", "FieldValueForbidden"))
    if causes:
        raise validation.invalid_object(resource, _name(old), causes)
    generation = meta(old).get("generation")
    if spec != before:
        meta(out)["generation"] = (generation if isinstance(generation, int) else 0) + 1


def _name(obj: Obj) -> str:
    return str(meta(obj).get("name") or "")


def _default(plural: str, spec: Obj) -> None:
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    if plural == "deployments":
        spec.setdefault("strategy", {"type": "RollingUpdate", "rollingUpdate": {
            "maxUnavailable": "25%", "maxSurge": "25%"}})
        spec.setdefault("progressDeadlineSeconds", 600)
    elif plural == "statefulsets":
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("updateStrategy", {"type": "RollingUpdate",
                                           "rollingUpdate": {"partition": 0}})
        spec.setdefault("persistentVolumeClaimRetentionPolicy",
                        {"whenDeleted": "Retain", "whenScaled": "Retain"})
    elif plural == "replicasets":
        spec.pop("revisionHistoryLimit")  # a ReplicaSet has none
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod = template["spec"]
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("schedulerName", "default-scheduler")


def _check(resource: Resource, obj: Obj) -> None:
    """The real ValidateDeploymentSpec/ReplicaSetSpec/StatefulSetSpec, for what the
    simulator uses; every cause found, in the real server's order."""
    spec: Obj = obj["spec"]
    causes: list[validation.Cause] = []
    replicas = spec.get("replicas")
    if not isinstance(replicas, int) or replicas < 0:
        causes.append(("spec.replicas", f"Invalid value: {replicas}: must be greater than or "
                       "equal to 0", "FieldValueInvalid"))
    if resource.plural == "statefulsets" and spec.get("podManagementPolicy") not in (
            "OrderedReady", "Parallel"):
        causes.append(("spec.podManagementPolicy", "Unsupported value: "
                       f'"{spec.get("podManagementPolicy")}": supported values: '
                       '"OrderedReady", "Parallel"', "FieldValueNotSupported"))
    selector = spec.get("selector")
    raw = spec.get("template")
    template: Obj = raw if isinstance(raw, dict) else {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not isinstance(selector, dict):
        causes.append(("spec.selector", "Required value", "FieldValueRequired"))
    elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
        causes.append(("spec.selector", f"Invalid value: {_go_selector(selector)}: empty "
                       f"selector is invalid for {resource.kind.lower()}", "FieldValueInvalid"))
    elif not label_selector_matches(selector, labels):
        causes.append(("spec.template.metadata.labels", f"Invalid value: {_go_map(labels)}: "
                       "`selector` does not match template `labels`", "FieldValueInvalid"))
    raw = template.get("spec")
    pod: Obj = raw if isinstance(raw, dict) else {}
    if not pod.get("containers"):
        causes.append(("spec.template.spec.containers", "Required value",
                       "FieldValueRequired"))
    policy = pod.get("restartPolicy", "Always")
    if policy != "Always":
        causes.append(("spec.template.spec.restartPolicy", f'Unsupported value: "{policy}": '
                       'supported values: "Always"', "FieldValueNotSupported"))
    if causes:
        raise validation.invalid_object(resource, _name(obj), causes)


def _check_claim(resource: Resource, obj: Obj) -> None:
    spec = obj.get("spec")
    causes: list[validation.Cause] = []
    if not isinstance(spec, dict) or not spec.get("accessModes"):
        causes.append(("spec.accessModes", "Required value: at least 1 access mode is "
                       "required", "FieldValueRequired"))
    requests = ((spec or {}).get("resources") or {}).get("requests") or {}
    if "storage" not in requests:
        causes.append(("spec.resources[storage]", "Required value", "FieldValueRequired"))
    if causes:
        raise validation.invalid_object(resource, _name(obj), causes)


def _go_map(labels: Any) -> str:
    """A label map as Go's ``%#v`` prints it in the real server's message."""
    items = ", ".join(f'"{k}":"{v}"' for k, v in sorted((labels or {}).items()))
    return f"map[string]string{{{items}}}"


def _go_selector(selector: Any) -> str:
    """Approximately Go's ``%#v`` of a ``v1.LabelSelector`` (enough to name the value)."""
    labels = (selector or {}).get("matchLabels") if isinstance(selector, dict) else None
    return f"v1.LabelSelector{{MatchLabels:{_go_map(labels)}}}"
