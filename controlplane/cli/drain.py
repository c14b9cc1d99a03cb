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
from typing import Any

from controlplane.app.drains import drain_children
from controlplane.app.operations import submit_operation
from controlplane.app.specs import template_of
from controlplane.cli import render
from controlplane.cli.classes import class_for
from controlplane.cli.cluster import cluster_objects
from controlplane.cli.context import clock, opened
from controlplane.cli.options import limits_from
from controlplane.cli.progress import follow
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.errors import UsageError
from controlplane.machines.catalog import default_kinds
from controlplane.machines.config.classes import artifact_for, parse_class
from controlplane.machines.drain.planning import (
    DrainPlan,
    PlanRejected,
    node_info,
    plan_drain,
    pod_info,
)
from controlplane.store import migrate, queries
from controlplane.store.database import Database
from controlplane.wiring.cluster import access_from_args

ID_PLACEHOLDER = "<child-id>"


def build_plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], args: argparse.Namespace
               ) -> DrainPlan:
    try:
        return plan_drain(args.node, [node_info(n) for n in nodes], [pod_info(p) for p in pods],
                          targets=args.to or (), selector=args.selector)
    except PlanRejected as exc:
        raise UsageError(f"drain {args.node} refused: {exc}") from None


def drain_spec(plan: DrainPlan, pods: list[dict[str, Any]], klass: JsonObject,
               max_parallel: int) -> JsonObject:
    """The drain machine's spec: the plan, with each pod's template to restore from."""
    raw = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    children: list[JsonValue] = [{
        "pod": {"namespace": m.pod.namespace, "name": m.pod.name, "uid": m.pod.uid},
        "target": m.target, "template": template_of(raw[m.pod.key])} for m in plan.moves]
    left: list[JsonValue] = [{"pod": x.pod.key, "reason": x.reason} for x in plan.left]
    return {"node": plan.node, "max_parallel": max_parallel, "class": klass,
            "children": children, "left": left}


def plan_document(plan: DrainPlan, klass: JsonObject, max_parallel: int) -> JsonObject:
    """What ``--dry-run`` prints (``-o json``): the plan, the writes it would make."""
    cls = parse_class(klass, field="--repository")
    doc = plan.to_json()
    doc.update({
        "dry_run": True, "max_parallel": max_parallel,
        "would": [f"cordon node {plan.node} (spec.unschedulable=true)",
                  f"migrate {len(plan.moves)} pods, at most {max_parallel} at a time"],
        "artifacts_written": [artifact_for(cls, checkpoint_id=ID_PLACEHOLDER,
                                           namespace=m.pod.namespace, pod=m.pod.name)
                              for m in plan.moves],
        "artifacts_deleted": "each one, after its pod is verified running on the target",
        "refused": [{"pod": x.pod.key, "reason": x.reason} for x in plan.left],
    })
    return doc


def print_plan(plan: DrainPlan, doc: JsonObject, output: str) -> None:
    if output in ("json", "yaml"):
        render.structured(doc, output)
        return
    print(f"DRY RUN: nothing is changed. Draining {plan.node} would:")
    for line in doc["would"]:  # type: ignore[union-attr]
        print(f"  - {line}")
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
            if args.dry_run:
                print_plan(plan, plan_document(plan, klass, args.max_parallel), args.output)
                return 0
            spec = drain_spec(plan, pods, klass, args.max_parallel)
            outcome = await submit_operation(db, default_kinds(), access.observer, kind="drain",
                                             spec=spec, machine_id=new_id(), now=clock.now(),
                                             limits=limits_from(args))
        print(outcome.machine_id)
        print(f"drain {plan.node}: {len(plan.moves)} pods to move, {len(plan.left)} left alone, "
              f"at most {args.max_parallel} at a time")
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
