"""What a resource asks for: the operation (machine kind and request) of a custom resource.

Each resource kind is an operation kind with its own spelling of the request's fields
(:data:`RESOURCES`): a ``Checkpoint``, ``Migration`` or ``Suspension`` of the pod
``spec.podName`` in the resource's namespace, a ``Restore`` of a checkpoint (named by its
resource, or by the operation's id), a ``Drain`` of ``spec.nodeName``. The door only turns
the resource's spec into fields; the request is prepared as every door prepares one
(``app.requests``). The class ``spec.className`` (default ``default``) is the
``CheckpointClass`` of that name, else the classes file's. The operation's id is the
resource's UID (:func:`operation_id`), and a suspension's resume has an id derived from
it (:func:`resume_id`), so a second worker, a restart or a replayed watch finds the
operation instead of creating another.

Bad input raises ``UsageError`` naming the resource's field (``spec.podName``), which the
front door writes to the resource as ``Accepted=False``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.app.ports import ClusterAccess
from controlplane.app.requests import Prepared, find, parse, prepare, prepare_asked
from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.frontdoor.ports import Resource
from controlplane.machines.base.requests import Checkpoint
from controlplane.store.database import Database


@dataclass(frozen=True)
class ResourceKind:
    """A resource kind: the operation it asks for, and how its spec spells each field of
    the request (a field it does not spell, it does not take)."""

    operation: str
    spelled: Mapping[str, str]


#: Every resource kind that asks for an operation (``CheckpointClass`` is configuration).
RESOURCES = {
    "Checkpoint": ResourceKind("checkpoint", {"workload": "spec.podName",
                                              "class": "spec.className",
                                              "quiesce": "spec.quiesce"}),
    "Migration": ResourceKind("migration", {"workload": "spec.podName",
                                            "class": "spec.className",
                                            "targetNode": "spec.targetNodeName",
                                            "name": "spec.restoredPodName",
                                            "keepCheckpoint": "spec.keepCheckpoint",
                                            "mode": "spec.mode"}),
    "Suspension": ResourceKind("suspend", {"workload": "spec.podName",
                                           "class": "spec.className"}),
    "Restore": ResourceKind("restore", {"checkpoint": "spec.checkpointName",
                                        "node": "spec.nodeName", "name": "spec.podName"}),
    "Drain": ResourceKind("drain", {"node": "spec.nodeName", "class": "spec.className",
                                    "targets": "spec.targets", "selector": "spec.selector",
                                    "maxParallel": "spec.maxParallel"}),
}
#: A suspension's resume, asked for by ``operatingMode: Running``.
RESUME = ResourceKind("resume", {"workload": "spec.podName", "node": "spec.resumeNodeName"})
OPERATION_KINDS = tuple(RESOURCES)
DEFAULT_CLASS = "default"
_RESUME = uuid.UUID("5a1e6d0c-3f7e-4c2b-9b1d-0c6e2f4a8b11")  # the namespace of resume ids


class ClassSource(Protocol):
    """Checkpoint classes by name: the ``CheckpointClass`` resources, then the file."""

    async def class_named(self, name: str) -> JsonObject | None:
        """The class's definition (as ``parse_class`` takes it), or ``None``."""
        ...


@dataclass(frozen=True)
class Ask:
    """One operation a resource asks for: its id, and the request prepared."""

    machine_id: str
    prepared: Prepared


def operation_id(resource: Mapping[str, Any]) -> str:
    """The id of the operation a resource asks for first: its UID."""
    return str(resource["metadata"]["uid"])


def resume_id(resource: Mapping[str, Any]) -> str:
    """The id of a suspension's resume: derived from its UID, the same on every worker."""
    return str(uuid.uuid5(_RESUME, operation_id(resource)))


def wants_resume(resource: Mapping[str, Any]) -> bool:
    """Whether a ``Suspension`` asks for its pod back (``operatingMode: Running``)."""
    return resource.get("kind") == "Suspension" and _spec(resource).get(
        "operatingMode") == "Running"


def wants_cancel(resource: Mapping[str, Any]) -> bool:
    """Whether the resource asks to stop its operation: ``spec.cancel`` or deleted."""
    meta = resource.get("metadata") or {}
    return bool(_spec(resource).get("cancel")) or bool(meta.get("deletionTimestamp"))


def _spec(resource: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = resource.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _text(resource: Mapping[str, Any], name: str) -> str | None:
    """``spec.<name>`` if set (a string), else ``None``."""
    value = _spec(resource).get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UsageError(f"spec.{name} must be a string, got {value!r}")
    return value


def _required(resource: Mapping[str, Any], name: str) -> str:
    value = _text(resource, name)
    if value is None:
        raise UsageError(f"spec.{name} is required",
                         hint=f"set spec.{name} on the {resource.get('kind')}")
    return value


async def klass_of(resource: Mapping[str, Any], classes: ClassSource) -> JsonObject:
    """The class ``spec.className`` names (default ``default``), or a ``UsageError``."""
    name = _text(resource, "className") or DEFAULT_CLASS
    try:
        found = await classes.class_named(name)
    except InvalidSpec as exc:
        raise UsageError(f"spec.className {name!r}: {exc}",
                         hint=f"fix CheckpointClass {name}") from None
    if found is None:
        raise UsageError(f"spec.className {name!r}: no CheckpointClass of that name",
                         hint="create it (kubectl get checkpointclasses lists them) or name "
                              "another in spec.className")
    return found


def fields_of(resource: Mapping[str, Any], spelled: Mapping[str, str]
              ) -> dict[str, object]:
    """The request's fields from the resource's spec, under the names the request takes
    (``spec.podName`` is the workload in the resource's namespace)."""
    spec = _spec(resource)
    fields: dict[str, object] = {}
    for name, spelling in spelled.items():
        value = spec.get(spelling.removeprefix("spec."))
        if value is None or value == "":
            continue
        if name == "workload":
            namespace = (resource.get("metadata") or {}).get("namespace")
            value = f"{namespace}/{value}" if isinstance(value, str) else value
        fields[name] = value
    return fields


async def ask_of(resource: Resource, *, db: Database, access: ClusterAccess,
                 classes: ClassSource, checkpoint_ids: Mapping[str, str]) -> Ask:
    """The first operation ``resource`` asks for. ``checkpoint_ids``: a Restore's
    ``spec.checkpointName`` resolved to the operation id (the front door reads the named
    ``Checkpoint`` or ``Suspension``)."""
    kind = RESOURCES[str(resource.get("kind"))]
    fields = fields_of(resource, kind.spelled)
    if "class" in kind.spelled:
        fields["class"] = await klass_of(resource, classes)
    if kind.operation == "restore":
        fields["checkpoint"] = _checkpoint_named(resource, checkpoint_ids)
    asked = parse(kind.operation, fields, kind.spelled)
    found = await find(db, asked)
    if found.checkpoint is not None:
        refuse_foreign_checkpoint(resource, found.checkpoint)
    prepared = await prepare_asked(db, access, asked, found)
    return Ask(operation_id(resource), prepared)


def refuse_foreign_checkpoint(resource: Mapping[str, Any], checkpoint: Checkpoint) -> None:
    """A resource may restore only its own namespace's checkpoints: whoever may create a
    Restore in one namespace must not bring another namespace's pod (its memory, its
    identity) back through the front door's rights."""
    namespace = (resource.get("metadata") or {}).get("namespace")
    if checkpoint.namespace != namespace:
        raise UsageError(f"spec.operationID {checkpoint.operation_id!r}: that checkpoint is of "
                         f"a pod in namespace {checkpoint.namespace}, not {namespace}",
                         hint="a Restore restores only checkpoints of its own namespace; "
                              "create it there")


def _checkpoint_named(resource: Resource, checkpoint_ids: Mapping[str, str]) -> str:
    """A Restore's checkpoint: ``spec.operationID``, else the operation of the Checkpoint
    (or Suspension) ``spec.checkpointName`` names."""
    checkpoint = _text(resource, "operationID")
    if checkpoint is not None:
        return checkpoint
    name = _text(resource, "checkpointName")
    if name is None:
        raise UsageError("a Restore needs spec.checkpointName or spec.operationID",
                         hint="name the Checkpoint (or Suspension) to restore from")
    found = checkpoint_ids.get(name)
    if found is None:
        namespace = (resource.get("metadata") or {}).get("namespace")
        raise UsageError(f"spec.checkpointName {name!r}: no Checkpoint or Suspension "
                         f"of that name in namespace {namespace}",
                         hint="kubectl get checkpoints,suspensions lists them")
    return found


async def resume_ask(resource: Resource, *, db: Database, access: ClusterAccess) -> Ask:
    """A suspension's resume: its pod back from the newest suspension of the workload, on
    ``spec.resumeNodeName`` (or where the scheduler puts it)."""
    prepared = await prepare(db, access, kind=RESUME.operation,
                             fields=fields_of(resource, RESUME.spelled),
                             spelled=RESUME.spelled)
    return Ask(resume_id(resource), prepared)
