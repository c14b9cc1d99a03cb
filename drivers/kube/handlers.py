"""The action handlers for pods and events, idempotent by construction.

==========================  ===============================================================
action                      request, and what counts as done
==========================  ===============================================================
``AnnotatePod``             strategic merge patch of annotations (and labels, if given)
                            carrying ``metadata.uid``;
``RemovePodAnnotations``    done: applied, 404 (the pod is gone), or 422 on
                            ``metadata.uid`` (the name now belongs to another pod, which
                            must NOT be patched: UID provenance, safety gate 4)
``DeletePod``               DELETE with ``preconditions.uid`` (+ ``gracePeriodSeconds`` if
                            configured); done: accepted, 404, or 409 on the UID
                            precondition (the pod with that UID is gone; a same-named
                            newcomer is untouched). Any other 409 (a conflict storm) is
                            checked with one GET: done if that UID is gone, else retryable
``CreatePod``               POST of the deterministic name with REQUIRED node affinity;
                            done: created, or 409 ``AlreadyExists``
``ClaimPod``                GET of the gated pod, then a merge patch (``metadata.uid`` and
                            ``resourceVersion`` preconditions): restore annotations, node
                            affinity narrowed to the target, the gate removed; done:
                            applied, 404, another UID, or already claimed (the gate gone
                            and the annotations on it). A 409 (it changed) is retried
``EmitEvent``               POST of a core/v1 Event named from the action key; done:
                            created, or 409 ``AlreadyExists``
``SetNodeUnschedulable``    strategic merge patch of the node's ``spec.unschedulable`` (cordon
                            / uncordon); done: applied (patching to the value it already
                            has is a no-op), or 404 when uncordoning (nothing to uncordon)
==========================  ===============================================================

Any other failure becomes the worker's ``RetryableActionError`` (429, 5xx, timeouts,
conflicts) or ``TerminalActionError`` (403, 400/422, a missing namespace, malformed
params), chained from the typed API error, with the API reason as ``error_class``.
Called by the worker's ``ActionRunner`` (registered by :mod:`drivers.kube.driver`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from controlplane.clock import Clock, SystemClock
from controlplane.engine.decider import Action
from controlplane.logs import get_logger
from controlplane.machines.contract.actions import ActionType
from controlplane.worker.errors import TerminalActionError
from controlplane.worker.ports import ActionHandler
from drivers.kube import bodies
from drivers.kube.errors import (
    ApiAlreadyExists,
    ApiBadRequest,
    ApiConflict,
    ApiNotFound,
    KubeApiError,
    action_error,
)
from drivers.kube.resources import EVENTS, MERGE, NODES, PODS, CoreV1, Kind

log = get_logger("drivers.kube.handlers")



def _text(action: Action, field: str, *, optional: bool = False) -> str:
    value = action.params.get(field)
    if isinstance(value, str) and value:
        return value
    if optional and value in (None, ""):
        return ""
    raise TerminalActionError(f"{action.type} {action.key}: param {field!r} must be a "
                              f"non-empty string, got {value!r}")


def _string_map(action: Action, field: str) -> dict[str, str]:
    value = action.params.get(field) or {}
    if not isinstance(value, dict):
        raise TerminalActionError(f"{action.type} {action.key}: param {field!r} must be an "
                                  "object of strings")
    return {str(k): str(v) for k, v in value.items()}


def uid_mismatch(exc: KubeApiError) -> bool:
    """A 422 because the patch's ``metadata.uid`` is not the pod's (it was recreated)."""
    return isinstance(exc, ApiBadRequest) and exc.status == 422 and (
        any(c.get("field") == "metadata.uid" for c in exc.causes()) or "metadata.uid" in str(exc))


# A real API server words a failed UID precondition in two ways, depending on which layer
# caught it. The registry (k8s.io/apiserver/pkg/registry/rest/delete.go, BeforeDelete)
# answers almost every such DELETE; the storage layer (k8s.io/apiserver/pkg/storage,
# checkPreconditions) answers when the object changed between that check and the write.
_REGISTRY_UID_PRECONDITION = re.compile(
    r"the UID in the precondition \(.*\) does not match the UID in record \(")
_STORAGE_UID_PRECONDITION = "Precondition failed: UID in precondition: "


def says_uid_precondition_failed(message: str) -> bool:
    """Whether a 409's message is a failed UID precondition, in either wording. Pure.

    ``Operation cannot be fulfilled on Pod "x": the UID in the precondition (a) does not
    match the UID in record (b). The object might have been deleted and then recreated``
    (registry) or ``... Precondition failed: UID in precondition: a, UID in object meta: b``
    (storage). A failed ``resourceVersion`` precondition is neither.
    """
    return (_REGISTRY_UID_PRECONDITION.search(message) is not None
            or _STORAGE_UID_PRECONDITION in message)


def uid_precondition_failed(exc: KubeApiError) -> bool:
    """A 409 because ``preconditions.uid`` named another pod than the one there now;
    other 409s on DELETE are transient conflicts."""
    return isinstance(exc, ApiConflict) and says_uid_precondition_failed(str(exc))


class PodActions:
    """The five handlers over one :class:`CoreV1`; :meth:`handlers` maps type -> handler."""

    def __init__(self, api: CoreV1, *, clock: Clock | None = None,
                 delete_grace_seconds: int | None = None,
                 component: str = "checkpoint-controlplane") -> None:
        self.api = api
        self.clock = clock or SystemClock()
        self.delete_grace_seconds = delete_grace_seconds
        self.component = component

    def handlers(self) -> dict[str, ActionHandler]:
        return {ActionType.ANNOTATE_POD: self.annotate_pod,
                ActionType.REMOVE_POD_ANNOTATIONS: self.remove_pod_annotations,
                ActionType.DELETE_POD: self.delete_pod, ActionType.CREATE_POD: self.create_pod,
                ActionType.CLAIM_POD: self.claim_pod,
                ActionType.EMIT_EVENT: self.emit_event}

    async def annotate_pod(self, action: Action, /) -> None:
        changes: dict[str, str | None] = dict(_string_map(action, "annotations"))
        labels = _string_map(action, "labels") if "labels" in action.params else {}
        await self._patch_annotations(action, changes, labels)

    async def remove_pod_annotations(self, action: Action, /) -> None:
        keys = action.params.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TerminalActionError(f"{action.type} {action.key}: param 'keys' must be a "
                                      "list of strings")
        changes: dict[str, str | None] = {str(k): None for k in keys}
        await self._patch_annotations(action, changes)

    async def _patch_annotations(self, action: Action, changes: dict[str, str | None],
                                 labels: Mapping[str, str] | None = None) -> None:
        namespace, name, uid = (_text(action, "namespace"), _text(action, "name"),
                                _text(action, "uid"))
        what = f"{action.type} pod {namespace}/{name} (uid {uid})"
        try:
            await self.api.patch(PODS, name, bodies.annotation_patch(uid, changes, labels),
                                 namespace=namespace)
        except ApiNotFound:
            log.info("pod gone; nothing to patch", action=action.type, key=action.key)
        except KubeApiError as exc:
            if uid_mismatch(exc):
                log.info("pod recreated under the same name; not patched", action=action.type,
                         key=action.key)
                return
            raise action_error(exc, what) from exc

    async def delete_pod(self, action: Action, /) -> None:
        namespace, name, uid = (_text(action, "namespace"), _text(action, "name"),
                                _text(action, "uid"))
        try:
            await self.api.delete(PODS, name, namespace=namespace, uid=uid,
                                  grace_period_seconds=self.delete_grace_seconds)
        except ApiNotFound:
            return
        except ApiConflict as exc:
            if uid_precondition_failed(exc) or not await self._still_there(namespace, name, uid):
                log.info("pod with that uid is gone; a newcomer is untouched", key=action.key)
                return
            raise action_error(exc, f"DeletePod {namespace}/{name} (uid {uid})") from exc
        except KubeApiError as exc:
            raise action_error(exc, f"DeletePod {namespace}/{name} (uid {uid})") from exc

    async def _still_there(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the pod with ``uid`` still exists; when unsure, assume it does."""
        try:
            current = await self.api.get(PODS, name, namespace=namespace)
        except ApiNotFound:
            return False
        except KubeApiError:
            return True  # the caller retries; claiming "deleted" unproven is never safe
        return str((current.get("metadata") or {}).get("uid") or "") == uid

    async def create_pod(self, action: Action, /) -> None:
        namespace, name = _text(action, "namespace"), _text(action, "name")
        template = action.params.get("template")
        node = action.params.get("node")
        if not isinstance(template, dict) or not (node is None or isinstance(node, str)):
            raise TerminalActionError(f"CreatePod {action.key}: params 'template' (object) and "
                                      "'node' (string or null) are required")
        try:
            body = bodies.restore_pod(namespace=namespace, name=name, template=template,
                                      node=node or None,
                                      annotations=_string_map(action, "annotations"),
                                      labels=_string_map(action, "labels"),
                                      images=_string_map(action, "images"))
        except ValueError as exc:
            raise TerminalActionError(f"CreatePod {action.key}: {exc}") from exc
        await self._create(PODS, body, namespace, f"CreatePod {namespace}/{name}")

    async def claim_pod(self, action: Action, /) -> None:
        namespace, name, uid = (_text(action, "namespace"), _text(action, "name"),
                                _text(action, "uid"))
        gate, node = _text(action, "gate"), action.params.get("node")
        annotations = _string_map(action, "annotations")
        what = f"ClaimPod {namespace}/{name} (uid {uid})"
        try:
            pod = await self.api.get(PODS, name, namespace=namespace)
        except ApiNotFound:
            log.info("pod gone; nothing to claim", key=action.key)
            return
        except KubeApiError as exc:
            raise action_error(exc, what) from exc
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != uid:
            log.info("pod recreated under the same name; not claimed", key=action.key)
            return
        gated = any(isinstance(g, dict) and g.get("name") == gate
                    for g in spec.get("schedulingGates") or [])
        have = meta.get("annotations") or {}
        if not gated and all(have.get(k) == v for k, v in annotations.items()):
            return  # claimed already (a repeat after a crash)
        try:
            body = bodies.claim_patch(pod, node=node if isinstance(node, str) else None,
                                      gate=gate, annotations=annotations,
                                      images=_string_map(action, "images"))
        except ValueError as exc:
            raise TerminalActionError(f"{what}: {exc}") from exc
        try:
            await self.api.patch(PODS, name, body, namespace=namespace, patch_type=MERGE)
        except ApiNotFound:
            return
        except KubeApiError as exc:
            if uid_mismatch(exc):
                return
            raise action_error(exc, what) from exc

    async def emit_event(self, action: Action, /) -> None:
        namespace = _text(action, "namespace")
        involved = action.params.get("object")
        if not isinstance(involved, dict) or not involved.get("name"):
            raise TerminalActionError(f"EmitEvent {action.key}: param 'object' needs a name")
        type_ = _text(action, "type")
        if type_ not in ("Normal", "Warning"):
            raise TerminalActionError(f"EmitEvent {action.key}: type {type_!r} is not "
                                      "Normal or Warning")
        name = bodies.event_name(str(involved["name"]), action.key)
        body = bodies.event_body(namespace=namespace, name=name, involved=involved,
                                 type_=type_, reason=_text(action, "reason"),
                                 message=_text(action, "message", optional=True),
                                 component=self.component, at=self.clock.now())
        await self._create(EVENTS, body, namespace, f"EmitEvent {namespace}/{name}")

    async def _create(self, kind: Kind, body: dict[str, Any], namespace: str,
                      what: str) -> None:
        try:
            await self.api.create(kind, body, namespace=namespace)
        except ApiAlreadyExists:
            return
        except KubeApiError as exc:
            raise action_error(exc, what) from exc


class NodeActions:
    """Cordon and uncordon (``SetNodeUnschedulable``) over one :class:`CoreV1`."""

    def __init__(self, api: CoreV1) -> None:
        self.api = api

    def handlers(self) -> dict[str, ActionHandler]:
        return {ActionType.SET_NODE_UNSCHEDULABLE: self.set_unschedulable}

    async def set_unschedulable(self, action: Action, /) -> None:
        node = _text(action, "node")
        value = action.params.get("unschedulable")
        if not isinstance(value, bool):
            raise TerminalActionError(f"{action.type} {action.key}: param 'unschedulable' "
                                      "must be true or false")
        try:
            await self.api.patch(NODES, node, {"spec": {"unschedulable": value}})
        except ApiNotFound as exc:
            if not value:
                log.info("node gone; nothing to uncordon", key=action.key)
                return
            raise action_error(exc, f"cordon node {node}") from exc
        except KubeApiError as exc:
            raise action_error(exc, f"{'cordon' if value else 'uncordon'} node {node}") from exc
