"""The action types the product machines emit, with typed constructors.

Drivers implement each type idempotently ("already exists" / "not found" count as done)
and honour every precondition; a failure for good comes back as ``ActionFailed``.

============================  ==========================================================
type                          params
============================  ==========================================================
``AnnotatePod``               ``namespace``, ``name``, ``uid`` (precondition: patch only
                              the pod with this UID), ``annotations`` (key -> value)
``RemovePodAnnotations``      ``namespace``, ``name``, ``uid`` (precondition), ``keys``
                              (list; absent keys are fine)
``DeletePod``                 ``namespace``, ``name``, ``uid`` (precondition: delete only
                              this UID; a recreated pod of the same name is untouched),
                              ``reason`` (why, for audit)
``CreatePod``                 ``namespace``, ``name`` (deterministic), ``template`` (the
                              saved pod: ``metadata`` labels/annotations + ``spec``),
                              ``node`` (REQUIRED node affinity on
                              ``kubernetes.io/hostname``, never ``nodeName``; ``None``:
                              no affinity), ``annotations``, ``labels`` (merged over the
                              template's)
``DeleteManifest``            ``repository`` (``registry/repo``), ``digest``
                              (``sha256:...``): delete the manifest by digest
``EmitEvent``                 ``namespace``, ``object`` (``{"kind", "name", "uid"}``),
                              ``type`` (``Normal`` | ``Warning``), ``reason``, ``message``
``SetNodeUnschedulable``      ``node``, ``unschedulable`` (cordon or uncordon)
``SubmitOperation``           ``machine_id`` (derived from the parent), ``kind``,
                              ``spec``, ``parent``: create a child machine (the drain's)
============================  ==========================================================

:class:`ActionType` is the one list of these names: the machines build actions with the
constructors below, and the drivers and the worker key their handlers by it.
Called by the capture, restore, source and machine modules. Pure constructors.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject, JsonValue


class ActionType(StrEnum):
    """Every action type a machine emits; a driver or the worker performs each."""

    ANNOTATE_POD = "AnnotatePod"
    REMOVE_POD_ANNOTATIONS = "RemovePodAnnotations"
    DELETE_POD = "DeletePod"
    CREATE_POD = "CreatePod"
    CLAIM_POD = "ClaimPod"
    DELETE_MANIFEST = "DeleteManifest"
    EMIT_EVENT = "EmitEvent"
    SET_NODE_UNSCHEDULABLE = "SetNodeUnschedulable"
    SUBMIT_OPERATION = "SubmitOperation"


class EventType(StrEnum):
    """Kubernetes Event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


def annotate_pod(key: str, *, namespace: str, name: str, uid: str,
                 annotations: Mapping[str, str],
                 labels: Mapping[str, str] | None = None) -> Action:
    """Patch annotations (and ``labels``, when given) onto the pod ``namespace/name`` only
    if its UID is ``uid``."""
    body: JsonObject = {k: v for k, v in sorted(annotations.items())}
    params: JsonObject = {"namespace": namespace, "name": name, "uid": uid,
                          "annotations": body}
    if labels:
        params["labels"] = {k: v for k, v in sorted(labels.items())}
    return Action(ActionType.ANNOTATE_POD, key, params)


def remove_pod_annotations(key: str, *, namespace: str, name: str, uid: str,
                           keys: tuple[str, ...]) -> Action:
    """Remove annotation ``keys`` from the pod, only if its UID is ``uid``."""
    listed: list[JsonValue] = list(keys)
    return Action(ActionType.REMOVE_POD_ANNOTATIONS, key, {"namespace": namespace, "name": name,
                                                "uid": uid, "keys": listed})


def delete_pod(key: str, *, namespace: str, name: str, uid: str, reason: str) -> Action:
    """Delete the pod with a UID precondition (a same-named newcomer is never touched)."""
    return Action(ActionType.DELETE_POD, key, {"namespace": namespace, "name": name, "uid": uid,
                                    "reason": reason})


def create_pod(key: str, *, namespace: str, name: str, template: JsonObject, node: str | None,
               annotations: Mapping[str, str], labels: Mapping[str, str],
               images: Mapping[str, str] | None = None) -> Action:
    """Create a pod from a saved template with REQUIRED node affinity to ``node``;
    ``images`` replaces named containers' images (CRI-O restores checkpoint images)."""
    params: JsonObject = {
        "namespace": namespace, "name": name, "template": template, "node": node,
        "annotations": {k: v for k, v in sorted(annotations.items())},
        "labels": {k: v for k, v in sorted(labels.items())},
    }
    if images:
        params["images"] = {k: v for k, v in sorted(images.items())}
    return Action(ActionType.CREATE_POD, key, params)


def claim_pod(key: str, *, namespace: str, name: str, uid: str, node: str | None,
              annotations: Mapping[str, str], gate: str,
              images: Mapping[str, str] | None = None) -> Action:
    """Take a controller's gated pod for a restore, only if its UID is ``uid``: put the
    ``annotations`` on it, narrow its required node affinity to ``node``, set the named
    containers' ``images`` and remove the scheduling ``gate`` (what a gated pod may still
    receive, KEP-3838; a container's image is always mutable)."""
    params: JsonObject = {
        "namespace": namespace, "name": name, "uid": uid, "node": node, "gate": gate,
        "annotations": {k: v for k, v in sorted(annotations.items())},
    }
    if images:
        params["images"] = {k: v for k, v in sorted(images.items())}
    return Action(ActionType.CLAIM_POD, key, params)


def delete_manifest(key: str, *, repository: str, digest: str) -> Action:
    """Delete the manifest ``repository@digest`` from the registry."""
    return Action(ActionType.DELETE_MANIFEST, key, {"repository": repository, "digest": digest})


def emit_event(key: str, *, namespace: str, pod_name: str, pod_uid: str | None,
               type_: EventType, reason: str, message: str) -> Action:
    """Record a Kubernetes Event about a pod (best effort: never verified)."""
    return Action(ActionType.EMIT_EVENT, key, {
        "namespace": namespace, "object": {"kind": "Pod", "name": pod_name, "uid": pod_uid},
        "type": type_.value, "reason": reason, "message": message,
    })
