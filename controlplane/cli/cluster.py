"""Operator verbs against a cluster: ``checkpoint``, ``migrate``, ``suspend``, ``resume``,
``restore`` and ``drain``.

Each verb only turns its flags into the request's fields (:func:`fields_of`; errors name
the flag the operator typed, :data:`SPELLED`) and hands them to the one use case every
door shares (``app.requests``): the request is prepared on one look at the cluster (the
pod read by GET: its UID pins the operation to it, its spec becomes the template to
restore from; a resume's checkpoint from the newest suspension; a restore's from the
checkpoint it names; a drain's plan from the cluster as listed), then submitted
(admitted, queued or refused) or, with ``--dry-run``, planned (``cli.dryrun``), writing
nothing. It prints the operation id and, with ``--wait``, follows it until it settles:
exit 0 when it did what was asked, 1 otherwise. The cluster is reached through
``wiring.cluster`` (no watch, no worker); the worker (``cpctl worker --kubeconfig ...``)
performs the operations.
"""

from __future__ import annotations

import argparse
import sys

from controlplane.app.drains import parallelism
from controlplane.app.plan import plan_request
from controlplane.app.requests import find, parse, prepare_asked, submit
from controlplane.cli import dryrun
from controlplane.cli.classes import class_for, given_class
from controlplane.cli.context import clock, opened, requester
from controlplane.cli.drain import print_children
from controlplane.cli.options import limits_from
from controlplane.cli.progress import follow, succeeded
from controlplane.clock import new_id
from controlplane.machines.catalog import default_kinds, view_of
from controlplane.machines.drain.request import DEFAULT_MAX_PARALLEL
from controlplane.store import migrate
from controlplane.wiring.cluster import access_from_args

#: How the CLI spells each request field: a refusal names the flag the operator typed.
SPELLED = {"targetNode": "--to", "targets": "--to",
           "class": "--repository/--class", "name": "--name", "node": "--node",
           "checkpoint": "CHECKPOINT", "quiesce": "--quiesce", "selector": "--selector",
           "maxParallel": "--max-parallel", "keepCheckpoint": "--keep-checkpoint",
           "mode": "--mode"}


def fields_of(args: argparse.Namespace) -> dict[str, object]:
    """The request's fields from the verb's flags (a flag the verb lacks is absent)."""
    to = getattr(args, "to", None)
    # A resume's checkpoint is where its suspension put it: its class, unless given.
    klass = given_class(args) if args.kind == "resume" else (
        class_for(args) if args.kind != "restore" else None)
    return {"workload": getattr(args, "workload", None), "class": klass,
            "quiesce": getattr(args, "quiesce", None) or None,
            "targetNode": to if args.kind == "migration" else None,
            "targets": to if args.kind == "drain" else None,
            "name": getattr(args, "name", None), "node": getattr(args, "node", None),
            "checkpoint": getattr(args, "checkpoint", None),
            "selector": getattr(args, "selector", None),
            "maxParallel": getattr(args, "max_parallel", None),
            "keepCheckpoint": getattr(args, "keep_checkpoint", None) or None,
            "mode": getattr(args, "mode", None)}


async def operation_cmd(args: argparse.Namespace) -> int:
    """Every operation verb: prepare, then plan (``--dry-run``) or submit."""
    asked = parse(args.kind, fields_of(args), SPELLED)  # bad flags: before any connection
    async with opened(args) as db:
        await migrate.require_current(db)
        found = await find(db, asked)  # what it names in the store: said before connecting
        async with access_from_args(db, args) as access:
            if args.kind == "drain":
                run = parallelism(args.max_parallel or DEFAULT_MAX_PARALLEL,
                                  limits_from(args))
                # Only a value the user gave is warned about; a default's cap is said
                # in the summary line ("at most N at a time (... caps ...)").
                if run.warning and args.max_parallel is not None and \
                        not (args.dry_run and args.output == "table"):
                    # stderr: -o json on stdout stays one document (a table plan says it)
                    sys.stderr.write(f"cpctl: warning: {run.warning}\n")
            if getattr(args, "dry_run", False):
                doc = await plan_request(
                    db, access, asked, limits=limits_from(args), now=clock.now(),
                    found=found,
                    parallel_given=getattr(args, "max_parallel", None) is not None)
                return dryrun.print_plan(doc, args.output)
            prepared = await prepare_asked(db, access, asked, found)
            outcome = await submit(db, default_kinds(), prepared, machine_id=new_id(),
                                   now=clock.now(), limits=limits_from(args),
                                   requester=requester(args))
        print(outcome.machine_id)
        if outcome.queued:
            print(f"queued: {outcome.queued}")
        label = f"{args.verb} {prepared.workload.removeprefix('node:')}"
        if args.kind == "restore":
            label += f" on {args.node}"
        if args.kind == "drain":
            shown = prepared.shown
            moves, left = shown.get("moves"), shown.get("left")
            run = parallelism(int(str(prepared.spec["max_parallel"])), limits_from(args))
            moving = len(moves) if isinstance(moves, list) else 0
            print(f"{label}: {moving} pod{'' if moving == 1 else 's'} to move, "
                  f"{len(left) if isinstance(left, list) else 0} left alone, at most "
                  f"{run.effective} at a time"
                  + (f" ({run.capped_by} caps --max-parallel {run.asked})" if run.capped_by
                     else ""))
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, label, limit_seconds=args.wait_seconds)
        if args.kind == "drain":
            await print_children(db, outcome.machine_id)
    view = view_of(record.kind)
    pod = view.final_pod(record.state, record.phase) if view else None
    print(f"{label}: {record.phase}" + (f" (pod {pod})" if pod else ""))
    return 0 if succeeded(record) else 1
