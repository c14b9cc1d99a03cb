"""The spec of each operation from a workload reference: what the CLI's verbs and the HTTP
API's POSTs submit.

The pod is read from the API server (``ClusterAccess.get_pod``: its UID pins the
operation to this pod, its spec becomes the template to restore from); a resume takes
its checkpoint from the newest suspension of the workload, a restore from the
checkpoint operation it names (``app.checkpoints``). Bad input raises ``UsageError``
naming the field and the fix.
"""

from __future__ import annotations

from typing import Any

from controlplane.app.checkpoints import checkpoint_of, latest_suspension
from controlplane.app.ports import ClusterAccess
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.machines.config.classes import parse_class
from controlplane.machines.owners import BARE, controller_of, how_moved, why_not_movable
from controlplane.store.database import Database

#: The kinds submitted for a workload (``namespace/name``), by their CLI verb.
KIND_OF_VERB = {"checkpoint": "checkpoint", "migrate": "migration", "suspend": "suspend",
                "resume": "resume"}


def workload_of(text: str, *, field: str = "workload") -> tuple[str, str]:
    """``namespace/name`` parsed, or a ``UsageError`` naming ``field``."""
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise UsageError(f"{field} {text!r} is not NAMESPACE/POD", hint="e.g. default/web")
    return ns, name


def template_of(pod: dict[str, Any]) -> JsonObject:
    """The pod to restore from: its labels and spec, minus its node binding."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {"metadata": {"labels": dict(meta.get("labels") or {})}, "spec": spec}


def pod_ref(pod: dict[str, Any]) -> JsonObject:
    meta = pod["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


async def read_pod(access: ClusterAccess, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API server has it, or a ``UsageError`` saying it is not there."""
    pod = await access.get_pod(namespace, name)
    if pod is None:
        raise UsageError(f"pod {namespace}/{name} not found",
                         hint=f"check it with kubectl get pod -n {namespace} {name}")
    return dict(pod)


async def workload_spec(db: Database, access: ClusterAccess | None, *, kind: str,
                        namespace: str,
                        name: str, klass: JsonObject | None, quiesce: bool = False,
                        target_node: str | None = None, node: str | None = None,
                        restore_name: str | None = None) -> JsonObject:
    """The spec of a ``checkpoint``, ``migration``, ``suspend`` or ``resume`` of
    ``namespace/name`` (``target_node``: a migration's; ``node``: where a resume runs;
    ``restore_name``: what a migration names the restored pod, by default the source's own
    name once the source is gone). A resume reads only the store, so it needs no
    ``access``. ``klass`` ``None``: a resume's is the suspension's own class (where its
    checkpoint is); the other kinds need one."""
    if kind == "resume":
        latest = await latest_suspension(db, namespace, name)
        klass = klass if klass is not None else latest.klass
        if klass is None:
            raise UsageError(f"the suspension of {namespace}/{name} ({latest.operation_id}) "
                             "recorded no checkpoint class",
                             hint="say where its checkpoint is: --repository or --class")
        return {"namespace": namespace, "name": name, "node": node,
                "template": latest.template, "class": klass,
                "candidates": [latest.candidate()]}
    if klass is None:
        raise UsageError(f"a {kind} needs a checkpoint class",
                         hint="say where checkpoints go: --repository or --class")
    if access is None:
        raise ValueError(f"a {kind} spec reads the pod: pass the cluster access")
    pod = await read_pod(access, namespace, name)
    verb = {"migration": "migration", "suspend": "suspend"}.get(kind)
    movable = parse_class(klass, field="class").movable_owners
    refusal = why_not_movable(pod, verb=verb, movable=movable) if verb else None
    if refusal is not None:
        raise UsageError(f"pod {namespace}/{name} cannot be moved: {refusal}",
                         hint=f"cpctl checkpoint {namespace}/{name} captures it without "
                              "deleting it")
    if kind == "checkpoint":
        return {"pod": pod_ref(pod), "class": klass, "quiesce": quiesce}
    if kind == "suspend":
        return {"pod": pod_ref(pod), "template": template_of(pod), "class": klass}
    if kind == "migration":
        spec: JsonObject = {
            "pod": pod_ref(pod), "source_node": (pod.get("spec") or {}).get("nodeName"),
            "target_node": target_node, "template": template_of(pod), "class": klass,
            "restore_name": restore_name or name}
        how = how_moved(pod, verb="migration", movable=movable)
        if how != BARE and restore_name is not None and restore_name != name:
            owner = controller_of(pod)
            raise UsageError(f"--name {restore_name}: pod {namespace}/{name} belongs to "
                             f"{owner}, which names the restored pod",
                             hint="leave out --name; cpctl get prints the restored pod's name")
        if how != BARE:
            spec["successor"] = how  # its controller (ReplicaSet, StatefulSet) names it
        else:
            spec["keep_name"] = True
        return spec
    raise UsageError(f"kind {kind!r} is not submitted for a workload",
                     hint="one of checkpoint, migration, suspend, resume")


async def restore_spec(db: Database, access: ClusterAccess, *, checkpoint: str,
                       node: str | None, name: str | None = None) -> JsonObject:
    """The ``restore`` spec for the artifact of checkpoint (or suspend) ``checkpoint``."""
    found = await checkpoint_of(db, checkpoint)
    ns, pod_name = found.namespace, found.name
    template = found.template
    if template is None:  # a checkpoint keeps no template: read the pod
        try:
            template = template_of(await read_pod(access, ns, pod_name))
        except UsageError:
            raise UsageError(f"the pod {ns}/{pod_name} that checkpoint {found.operation_id} "
                             "captured is gone and the checkpoint kept no pod spec",
                             hint="restore from a suspend operation instead") from None
    return {"artifact": found.artifact, "namespace": ns,
            "name": name or f"{pod_name}-restored-{found.operation_id[:8]}",
            "node": node, "template": template, "checkpoint_id": found.checkpoint_id,
            "source_uid": found.source_uid, "class": found.klass}
