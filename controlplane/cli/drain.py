"""``cpctl drain NODE``: plan the moves off a node, then run them as one durable drain.

Reads the cluster (GET/LIST only: nodes and pods), plans with the pure planner
(:func:`controlplane.machines.drain.planning.plan_drain`), and either prints the plan
(``--dry-run``: nothing is written — no event, no API write, no registry write) or
submits a ``drain`` machine carrying that plan, prints its id and, with ``--wait``,
follows it and prints each child and its outcome. Bad input (unknown node, the only
node, ``--to`` the node itself, a selector that matches nothing) exits 2, nothing changed.
A composition root: it reaches the cluster through ``wiring.product``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from controlplane.app.drains import (
    drain_children,
    drain_spec,
    parallelism,
    plan_document,
    plan_of,
)
from controlplane.app.operations import submit_operation
from controlplane.cli import render
from controlplane.cli.classes import class_for
from controlplane.cli.cluster import cluster_objects
from controlplane.cli.context import clock, opened, requester
from controlplane.cli.options import limits_from
from controlplane.cli.progress import follow
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.planning import (
    DrainPlan,
)
from controlplane.store import migrate, queries
from controlplane.store.database import Database
from controlplane.wiring.cluster import access_from_args


def build_plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], args: argparse.Namespace
               ) -> DrainPlan:
    return plan_of(args.node, nodes, pods, targets=args.to or (), selector=args.selector,
                   klass=class_for(args))


def print_plan(plan: DrainPlan, doc: JsonObject, output: str) -> None:
    if output in ("json", "yaml"):
        render.structured(doc, output)
        return
    print(f"DRY RUN: nothing is changed. Draining {plan.node} would:")
    for line in doc["would"]:  # type: ignore[union-attr]
        print(f"  - {line}")
    for warning in doc["warnings"]:  # type: ignore[union-attr]
        print(f"  warning: {warning}")
    if plan.moves:
        render.table(["pod", "target", "why"], [(m.pod.key, m.target, m.why)
                                                for m in plan.moves], max_width=100)
    if plan.left:
        print("left alone (refused):")
        render.table(["pod", "reason"], [(x.pod.key, x.reason) for x in plan.left],
                     max_width=100)
    print("artifacts written (one per pod; deleted after its verified restore):")
    for ref in doc["artifacts_written"]:  # type: ignore[union-attr]
        print(f"  {ref}")


async def drain_cmd(args: argparse.Namespace) -> int:
    klass = class_for(args)
    async with opened(args) as db:
        await migrate.require_current(db)
        async with access_from_args(db, args) as access:
            nodes, pods = await cluster_objects(access)
            plan = build_plan(nodes, pods, args)
            run = parallelism(args.max_parallel, limits_from(args))
            if run.warning and not (args.dry_run and args.output == "table"):
                # stderr: -o json on stdout stays one document (a table plan says it)
                sys.stderr.write(f"cpctl: warning: {run.warning}\n")
            if args.dry_run:
                print_plan(plan, plan_document(plan, klass, args.max_parallel,
                                               limits_from(args)), args.output)
                return 0
            spec = drain_spec(plan, pods, klass, args.max_parallel)
            outcome = await submit_operation(db, default_kinds(), access.observer, kind="drain",
                                             spec=spec, machine_id=new_id(), now=clock.now(),
                                             limits=limits_from(args),
                                             requester=requester(args))
        print(outcome.machine_id)
        print(f"drain {plan.node}: {len(plan.moves)} pods to move, {len(plan.left)} left alone, "
              f"at most {run.effective} at a time"
              + (f" ({run.capped_by} caps --max-parallel {run.asked})" if run.capped_by
                 else ""))
        if not args.wait:
            return 0
        record = await follow(db, outcome.machine_id, f"drain {plan.node}",
                              limit_seconds=args.wait_seconds)
        await print_children(db, outcome.machine_id)
    print(f"drain {plan.node}: {record.phase}")
    return 0 if record.phase == "Succeeded" else 1


async def print_children(db: Database, drain_id: str) -> None:
    """Each child of a drain and its outcome (``cpctl get`` on a drain shows the same)."""
    record = await queries.get_machine(db, drain_id)
    rows = [(c.pod, c.target, c.id, c.status, c.phase or "-", c.reason or "-")
            for c in await drain_children(db, record)]
    if rows:
        render.table(["pod", "target", "child", "status", "outcome", "reason"], rows,
                     max_width=60)
    for pod_reason in record.state["spec"].get("left") or []:  # type: ignore[union-attr]
        assert isinstance(pod_reason, list)
        print(f"left alone: {pod_reason[0]}: {pod_reason[1]}")
    for line in late_lines(record.state):
        print(line)


def late_lines(state: JsonObject) -> list[str]:
    """One line per extension of the plan: when, which pods joined it, which were left."""
    out = []
    extensions = state.get("extensions")
    for ext in extensions if isinstance(extensions, list) else []:
        assert isinstance(ext, dict)
        joined = ", ".join(_strings(ext.get("joined"))) or "-"
        left = ", ".join(_strings(ext.get("left"))) or "-"
        out.append(f"found on the node after the plan, at {ext.get('at')}: moved {joined}; "
                   f"left alone {left}")
    return out


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
