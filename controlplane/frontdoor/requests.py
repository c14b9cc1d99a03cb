"""What a resource asks for: the operation (machine kind and spec) of a custom resource.

Each kind maps onto the submission the CLI's verbs and the HTTP API make
(``app.specs``, ``app.drains``): a ``Checkpoint``, ``Migration`` or ``Suspension`` of the
pod ``spec.podName`` in the resource's namespace, a ``Restore`` of a checkpoint (named by
its resource, or by the operation's id), a ``Drain`` of ``spec.nodeName``. The class
``spec.className`` (default ``default``) is the ``CheckpointClass`` of that name, else
the classes file's. The operation's id is the resource's UID (:func:`operation_id`), and
a suspension's resume has an id derived from it (:func:`resume_id`), so a second worker,
a restart or a replayed watch finds the operation instead of creating another.

Bad input raises ``UsageError`` naming the resource's field (``spec.podName``), which the
front door writes to the resource as ``Accepted=False``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.app.drains import drain_spec, plan_of
from controlplane.app.ports import ClusterAccess
from controlplane.app.specs import restore_spec, workload_spec
from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.frontdoor.ports import Resource
from controlplane.store.database import Database

#: The operation kinds (machine kinds) each resource kind submits first.
MACHINE_KIND = {"Checkpoint": "checkpoint", "Restore": "restore", "Migration": "migration",
                "Suspension": "suspend", "Drain": "drain"}
#: Resource kinds that ask for operations (``CheckpointClass`` is configuration).
OPERATION_KINDS = tuple(MACHINE_KIND)
DEFAULT_CLASS = "default"
DEFAULT_MAX_PARALLEL = 4
_RESUME = uuid.UUID("5a1e6d0c-3f7e-4c2b-9b1d-0c6e2f4a8b11")  # the namespace of resume ids


class ClassSource(Protocol):
    """Checkpoint classes by name: the ``CheckpointClass`` resources, then the file."""

    async def class_named(self, name: str) -> JsonObject | None:
        """The class's definition (as ``parse_class`` takes it), or ``None``."""
        ...


@dataclass(frozen=True)
class Ask:
    """One operation a resource asks for: its id, machine kind and spec."""

    machine_id: str
    kind: str
    spec: JsonObject


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


async def ask_of(resource: Resource, *, db: Database, access: ClusterAccess,
                 classes: ClassSource, checkpoint_ids: Mapping[str, str]) -> Ask:
    """The first operation ``resource`` asks for. ``checkpoint_ids``: a Restore's
    ``spec.checkpointName`` resolved to the operation id (the front door reads the named
    ``Checkpoint`` or ``Suspension``)."""
    kind = str(resource.get("kind"))
    meta = resource.get("metadata") or {}
    namespace = meta.get("namespace")
    machine_kind = MACHINE_KIND[kind]
    if kind == "Drain":
        return Ask(operation_id(resource), machine_kind,
                   await _drain(resource, access, classes))
    if kind == "Restore":
        checkpoint = _text(resource, "operationID")
        if checkpoint is None:
            name = _text(resource, "checkpointName")
            if name is None:
                raise UsageError("a Restore needs spec.checkpointName or spec.operationID",
                                 hint="name the Checkpoint (or Suspension) to restore from")
            checkpoint = checkpoint_ids.get(name)
            if checkpoint is None:
                raise UsageError(f"spec.checkpointName {name!r}: no Checkpoint or Suspension "
                                 f"of that name in namespace {namespace}",
                                 hint="kubectl get checkpoints,suspensions lists them")
        spec = await restore_spec(db, access, checkpoint=checkpoint,
                                  node=_required(resource, "nodeName"),
                                  name=_text(resource, "podName"))
        return Ask(operation_id(resource), machine_kind, spec)
    pod = _required(resource, "podName")
    namespace = str(namespace)
    klass = await klass_of(resource, classes)
    if kind == "Checkpoint":
        spec = await workload_spec(db, access, kind="checkpoint", namespace=namespace,
                                   name=pod, klass=klass,
                                   quiesce=bool(_spec(resource).get("quiesce", False)))
    elif kind == "Migration":
        spec = await workload_spec(db, access, kind="migration", namespace=namespace, name=pod,
                                   klass=klass, target_node=_required(resource, "targetNodeName"),
                                   restore_name=_text(resource, "restoredPodName"))
    else:  # Suspension
        spec = await workload_spec(db, access, kind="suspend", namespace=namespace, name=pod,
                                   klass=klass)
    return Ask(operation_id(resource), machine_kind, spec)


async def resume_ask(resource: Resource, *, db: Database) -> Ask:
    """A suspension's resume: its pod back from the newest suspension of the workload, on
    ``spec.resumeNodeName`` (or where the scheduler puts it)."""
    meta = resource["metadata"]
    spec = await workload_spec(db, None, kind="resume", namespace=str(meta["namespace"]),
                               name=_required(resource, "podName"), klass=None,
                               node=_text(resource, "resumeNodeName"))
    return Ask(resume_id(resource), "resume", spec)


async def _drain(resource: Resource, access: ClusterAccess, classes: ClassSource) -> JsonObject:
    node = _required(resource, "nodeName")
    klass = await klass_of(resource, classes)
    spec = _spec(resource)
    targets = spec.get("targets") or []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise UsageError("spec.targets must be a list of node names")
    max_parallel = spec.get("maxParallel", DEFAULT_MAX_PARALLEL)
    if not isinstance(max_parallel, int) or not 1 <= max_parallel <= 100:
        raise UsageError(f"spec.maxParallel must be 1 to 100, got {max_parallel!r}")
    selector = _text(resource, "selector")
    nodes = [dict(n) for n in await access.list_nodes()]
    pods = [dict(p) for p in await access.list_pods()]
    plan = plan_of(node, nodes, pods, targets=targets, selector=selector, klass=klass)
    return drain_spec(plan, pods, klass, max_parallel)
