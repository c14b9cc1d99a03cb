"""Operator verbs against a cluster: ``checkpoint``, ``migrate``, ``suspend``, ``resume``,
``restore``, and ``worker --kubeconfig`` (the product worker).

Each verb reads the pod from the API server (its UID and its spec, saved as the template
to restore from), submits through ``operations.submit_operation`` (validated against the
cluster, admitted, queued or refused), prints the operation id and, with ``--wait``,
follows it until it settles: exit 0 when it did what was asked, 1 otherwise. With
``--dry-run`` (migrate, suspend, restore) it validates and prints the plan instead
(``cli.dryrun``), writing nothing. ``restore CHECKPOINT --node N`` restores the artifact
of a checkpoint (or suspend) operation onto a node. The worker
(``cpctl worker --kubeconfig ...``) performs the operations; the node agents capture and
restore. A composition root: it imports the drivers (import-linter names the edges).
"""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.app.checkpoints import checkpoint_of, latest_suspension
from controlplane.app.operations import submit_operation
from controlplane.app.ports import ClusterAccess
from controlplane.cli import dryrun
from controlplane.cli.classes import class_for
from controlplane.cli.context import clock, opened
from controlplane.cli.options import limits_from
from controlplane.cli.progress import SUCCESS_PHASES, follow
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate
from controlplane.store.database import Database
from controlplane.wiring.cluster import access_from_args


def _workload(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise UsageError(f"workload {text!r} is not NAMESPACE/POD", hint="e.g. default/web")
    return ns, name


async def _pod(access: ClusterAccess, ns: str, name: str) -> dict[str, Any]:
    pod = await access.get_pod(ns, name)
    if pod is None:
        raise UsageError(f"pod {ns}/{name} not found",
                         hint=f"check it with kubectl get pod -n {ns} {name}")
    return dict(pod)


def template_of(pod: dict[str, Any]) -> JsonObject:
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
        latest = await latest_suspension(db, ns, name)
    return {"namespace": ns, "name": name, "node": args.node, "template": latest.template,
            "class": klass, "candidates": [latest.candidate()]}


async def operation_cmd(args: argparse.Namespace) -> int:
    ns, name = _workload(args.workload)
    klass = class_for(args)
    kind = {"checkpoint": "checkpoint", "migrate": "migration", "suspend": "suspend",
            "resume": "resume"}[args.verb]
    spec: JsonObject
    if kind == "resume":
        spec = await _resume_spec(args, ns, name, klass)
    async with opened(args) as db:
        await migrate.require_current(db)
        async with access_from_args(db, args) as access:
            if kind != "resume":
                spec = await _spec(kind, args, access, ns, name, klass)
            if getattr(args, "dry_run", False):
                return await dryrun.dry_run(db, access.observer, kind=kind, spec=spec,
                                            limits=limits_from(args), output=args.output)
            outcome = await submit_operation(db, default_kinds(), access.observer, kind=kind,
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


async def _spec(kind: str, args: argparse.Namespace, access: ClusterAccess, ns: str,
                name: str, klass: JsonObject) -> JsonObject:
    pod = await _pod(access, ns, name)
    if kind == "checkpoint":
        return {"pod": _ref(pod), "class": klass, "quiesce": args.quiesce}
    if kind == "suspend":
        return {"pod": _ref(pod), "template": template_of(pod), "class": klass}
    return {"pod": _ref(pod), "source_node": (pod.get("spec") or {}).get("nodeName"),
            "target_node": args.to, "template": template_of(pod), "class": klass}


async def cluster_objects(access: ClusterAccess
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every node and every pod, as the API server lists them now (LISTs only)."""
    return ([dict(n) for n in await access.list_nodes()],
            [dict(p) for p in await access.list_pods()])


async def _restore_spec(db: Database, access: ClusterAccess, args: argparse.Namespace
                        ) -> JsonObject:
    """The ``restore`` spec for the artifact of checkpoint (or suspend) ``args.checkpoint``."""
    found = await checkpoint_of(db, args.checkpoint)
    ns, name = found.namespace, found.name
    template = found.template
    if template is None:  # a checkpoint keeps no template: read the pod
        try:
            template = template_of(await _pod(access, ns, name))
        except UsageError:
            raise UsageError(f"the pod {ns}/{name} that checkpoint {found.operation_id} "
                             "captured is gone and the checkpoint kept no pod spec",
                             hint="restore from a suspend operation instead") from None
    return {"artifact": found.artifact, "namespace": ns,
            "name": args.name or f"{name}-restored-{found.operation_id[:8]}",
            "node": args.node, "template": template, "checkpoint_id": found.checkpoint_id,
            "source_uid": found.source_uid, "class": found.klass}


async def restore_cmd(args: argparse.Namespace) -> int:
    """``cpctl restore CHECKPOINT --node N``."""
    async with opened(args) as db:
        await migrate.require_current(db)
        async with access_from_args(db, args) as access:
            spec = await _restore_spec(db, access, args)
            if args.dry_run:
                return await dryrun.dry_run(db, access.observer, kind="restore", spec=spec,
                                            limits=limits_from(args), output=args.output)
            outcome = await submit_operation(db, default_kinds(), access.observer,
                                             kind="restore", spec=spec, machine_id=new_id(),
                                             now=clock.now(), limits=limits_from(args))
        print(outcome.machine_id)
        if outcome.queued:
            print(f"queued: {outcome.queued}")
        label = f"restore {spec['namespace']}/{spec['name']} on {args.node}"
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, label, limit_seconds=args.wait_seconds)
    print(f"{label}: {record.phase}")
    return 0 if record.phase in SUCCESS_PHASES else 1
