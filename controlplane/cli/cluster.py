"""Operator verbs against a cluster: ``checkpoint``, ``migrate``, ``suspend``, ``resume``,
and ``worker --kubeconfig`` (the product worker).

Each verb reads the pod from the API server (its UID and its spec, saved as the template
to restore from), submits through ``operations.submit_operation`` (validated against the
cluster, admitted, queued or refused), prints the operation id and, with ``--wait``,
follows it until it settles: exit 0 when it did what was asked, 1 otherwise. The worker
(``cpctl worker --kubeconfig ...``) performs the operations; the node agents capture and
restore. A composition root: it imports the drivers (import-linter names the edges).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.cli.assembly import Product, product
from controlplane.cli.commands import clock, opened
from controlplane.cli.options import limits_from
from controlplane.cli.progress import SUCCESS_PHASES, follow
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.machines.registry import default_kinds
from controlplane.operations import submit_operation
from controlplane.store import migrate, queries
from controlplane.store.database import Database
from controlplane.worker.runtime import Worker, WorkerConfig
from drivers.kube import KubeDriver
from drivers.kube.errors import ApiNotFound
from drivers.kube.resources import PODS
from drivers.registry.options import registry_from_options
from drivers.registry.port import Registry


def _registry(args: argparse.Namespace) -> Registry:
    return registry_from_options(layout=args.registry_layout,
                                 plain_http=args.registry_plain_http,
                                 credentials=args.registry_credentials)


def _connect(args: argparse.Namespace) -> dict[str, Any]:
    return {"kubeconfig": args.kubeconfig, "in_cluster": True if args.in_cluster else None}


def _workload(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise UsageError(f"workload {text!r} is not NAMESPACE/POD", hint="e.g. default/web")
    return ns, name


async def run_product_worker(db: Database, args: argparse.Namespace, config: WorkerConfig,
                             drive: Callable[[Worker], Awaitable[None]]) -> None:
    """``cpctl worker --kubeconfig ...``: drive every kind against the cluster."""
    async with product(db, clock, registry=_registry(args), config=config, run_worker=False,
                       **_connect(args)) as running:
        await drive(running.worker)


async def _pod(kube: KubeDriver, ns: str, name: str) -> dict[str, Any]:
    try:
        pod = await kube.api.get(PODS, name, namespace=ns)
    except ApiNotFound:
        raise UsageError(f"pod {ns}/{name} not found",
                         hint=f"check it with kubectl get pod -n {ns} {name}") from None
    return dict(pod)


def _template(pod: dict[str, Any]) -> JsonObject:
    """The pod to restore from: its labels and spec, minus its node binding."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {"metadata": {"labels": dict(meta.get("labels") or {})}, "spec": spec}


def _ref(pod: dict[str, Any]) -> JsonObject:
    meta = pod["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


async def _resume_spec(args: argparse.Namespace, ns: str, name: str,
                       klass: JsonObject) -> JsonObject:
    """Resume from the newest suspension of this workload that kept a checkpoint."""
    async with opened(args) as db:
        suspended = [r for r in await queries.list_machines(
            db, queries.MachineFilter(kind="suspend", phase="Suspended", limit=1000))
            if r.workload == f"{ns}/{name}"]
        if not suspended:
            raise UsageError(f"no suspension of {ns}/{name} is recorded",
                             hint="suspend it first with `cpctl suspend`")
        latest = suspended[0]
        history = await queries.history(db, latest.id)
    verified = next(e for e in history if e.type == "ArtifactVerified")
    requested = next(e for e in history if e.type == "CaptureRequested")
    pod = latest.spec["pod"]
    assert isinstance(pod, dict)
    return {"namespace": ns, "name": name, "node": args.node, "template": latest.spec["template"],
            "class": klass, "candidates": [{
                "artifact": verified.data["pinned"],
                "checkpoint_id": requested.data["checkpoint_id"], "source_uid": pod["uid"]}]}


async def operation_cmd(args: argparse.Namespace) -> int:
    ns, name = _workload(args.workload)
    klass: JsonObject = {"repository": args.repository}
    kind = {"checkpoint": "checkpoint", "migrate": "migration", "suspend": "suspend",
            "resume": "resume"}[args.verb]
    spec: JsonObject
    if kind == "resume":
        spec = await _resume_spec(args, ns, name, klass)
    async with opened(args) as db:
        await migrate.require_current(db)
        async with product(db, clock, registry=_registry(args), config=WorkerConfig(),
                           run_worker=False, **_connect(args)) as running:
            if kind != "resume":
                spec = await _spec(kind, args, running, ns, name, klass)
            outcome = await submit_operation(db, default_kinds(), running.fresh, kind=kind,
                                             spec=spec, machine_id=new_id(), now=clock.now(),
                                             limits=limits_from(args))
        print(outcome.machine_id)
        if outcome.queued:
            print(f"queued: {outcome.queued}")
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, f"{args.verb} {ns}/{name}",
                              limit_seconds=args.wait_seconds)
    print(f"{args.verb} {ns}/{name}: {record.phase}")
    return 0 if record.phase in SUCCESS_PHASES else 1


async def _spec(kind: str, args: argparse.Namespace, running: Product, ns: str, name: str,
                klass: JsonObject) -> JsonObject:
    pod = await _pod(running.kube, ns, name)
    if kind == "checkpoint":
        return {"pod": _ref(pod), "class": klass, "quiesce": args.quiesce}
    if kind == "suspend":
        return {"pod": _ref(pod), "template": _template(pod), "class": klass}
    return {"pod": _ref(pod), "source_node": (pod.get("spec") or {}).get("nodeName"),
            "target_node": args.to, "template": _template(pod), "class": klass}
