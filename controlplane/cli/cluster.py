"""Operator verbs against a cluster: ``checkpoint``, ``migrate``, ``suspend``, ``resume``
and ``restore``.

Each verb builds its spec with ``app.specs`` (the pod read from the API server by GET:
its UID, and its spec saved as the template to restore from; a resume's checkpoint from
the newest suspension; a restore's from the checkpoint it names), submits through
``operations.submit_operation`` (validated against the cluster, admitted, queued or
refused), prints the operation id and, with ``--wait``, follows it until it settles: exit
0 when it did what was asked, 1 otherwise. With ``--dry-run`` (migrate, suspend, restore)
it prints the plan instead (``cli.dryrun``), writing nothing. The cluster is reached
through ``wiring.cluster`` (no watch, no worker); the worker
(``cpctl worker --kubeconfig ...``) performs the operations.
"""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.app.operations import final_pod, submit_operation
from controlplane.app.ports import ClusterAccess
from controlplane.app.specs import KIND_OF_VERB, restore_spec, workload_of, workload_spec
from controlplane.cli import dryrun
from controlplane.cli.classes import class_for, given_class
from controlplane.cli.context import clock, opened, requester
from controlplane.cli.options import limits_from
from controlplane.cli.progress import SUCCESS_PHASES, follow
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate
from controlplane.wiring.cluster import access_from_args


async def operation_cmd(args: argparse.Namespace) -> int:
    ns, name = workload_of(args.workload)
    kind = KIND_OF_VERB[args.verb]
    # A resume's checkpoint is where its suspension put it: its class, unless given.
    klass = given_class(args) if kind == "resume" else class_for(args)
    async def spec_of(access: ClusterAccess | None) -> JsonObject:
        return await workload_spec(db, access, kind=kind, namespace=ns, name=name,
                                   klass=klass, quiesce=getattr(args, "quiesce", False),
                                   target_node=getattr(args, "to", None),
                                   node=getattr(args, "node", None),
                                   restore_name=getattr(args, "name", None))

    async with opened(args) as db:
        await migrate.require_current(db)
        # A resume's spec reads only the store: a missing suspension is said first.
        spec = await spec_of(None) if kind == "resume" else {}
        async with access_from_args(db, args) as access:
            if kind != "resume":
                spec = await spec_of(access)
            if getattr(args, "dry_run", False):
                return await dryrun.dry_run(db, access.observer, kind=kind, spec=spec,
                                            limits=limits_from(args), output=args.output)
            outcome = await submit_operation(db, default_kinds(), access.observer, kind=kind,
                                             spec=spec, machine_id=new_id(), now=clock.now(),
                                             limits=limits_from(args),
                                             requester=requester(args))
        print(outcome.machine_id)
        if outcome.queued:
            print(f"queued: {outcome.queued}")
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, f"{args.verb} {ns}/{name}",
                              limit_seconds=args.wait_seconds)
    pod = final_pod(record)
    print(f"{args.verb} {ns}/{name}: {record.phase}" + (f" (pod {pod})" if pod else ""))
    return 0 if record.phase in SUCCESS_PHASES else 1


async def cluster_objects(access: ClusterAccess
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every node and every pod, as the API server lists them now (LISTs only)."""
    return ([dict(n) for n in await access.list_nodes()],
            [dict(p) for p in await access.list_pods()])


async def restore_cmd(args: argparse.Namespace) -> int:
    """``cpctl restore CHECKPOINT --node N``."""
    async with opened(args) as db:
        await migrate.require_current(db)
        async with access_from_args(db, args) as access:
            spec = await restore_spec(db, access, checkpoint=args.checkpoint, node=args.node,
                                      name=args.name)
            if args.dry_run:
                return await dryrun.dry_run(db, access.observer, kind="restore", spec=spec,
                                            limits=limits_from(args), output=args.output)
            outcome = await submit_operation(db, default_kinds(), access.observer,
                                             kind="restore", spec=spec, machine_id=new_id(),
                                             now=clock.now(), limits=limits_from(args),
                                             requester=requester(args))
        print(outcome.machine_id)
        if outcome.queued:
            print(f"queued: {outcome.queued}")
        label = f"restore {spec['namespace']}/{spec['name']} on {args.node}"
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, label, limit_seconds=args.wait_seconds)
    print(f"{label}: {record.phase}")
    return 0 if record.phase in SUCCESS_PHASES else 1
