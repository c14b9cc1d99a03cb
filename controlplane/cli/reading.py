"""The verbs that read operations: ``cpctl get``, ``list``, ``history`` and ``wait``.

Each opens the database, reads the store's projections or history, prints; only the
store's queries are imported up front, so ``cpctl list`` starts as fast as a read can.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from controlplane.cli import render
from controlplane.cli.context import clock, opened
from controlplane.cli.history_view import Line, describe
from controlplane.cli.progress import follow, succeeded
from controlplane.cli.retention import print_pruned
from controlplane.cli.why import facts_text
from controlplane.errors import UsageError
from controlplane.store import queries
from controlplane.store.errors import MachineNotFound

if TYPE_CHECKING:
    from controlplane.engine.jsonvalue import JsonObject
    from controlplane.store.records import MachineRecord


def _record_json(r: MachineRecord) -> dict[str, Any]:
    """The operation's document, the HTTP API's (:mod:`controlplane.app.operation_doc`)."""
    from controlplane.app.operation_doc import operation_json

    return operation_json(r, detail=True)


async def get_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.drains import drain_children
    from controlplane.machines.drain.state import KIND as DRAIN

    structured = args.output in ("json", "yaml")
    async with opened(args) as db:
        record = await queries.get_machine(db, await queries.resolve_machine_id(db, args.id))
        children = ([(c.id, c.pod, c.target, c.outcome, c.reason or "",
                      c.joined_at or "planned")
                     for c in await drain_children(db, record)]
                    if record.kind == DRAIN and not structured else [])
    if structured:
        render.structured(_record_json(record), args.output)
    else:
        render.table(["field", "value"], list(_record_json(record).items()), max_width=120,
                     wide=args.wide)
        if record.kind == DRAIN:
            print()
            render.table(["child", "pod", "target", "phase/outcome", "reason", "joined"],
                         children, wide=args.wide)
    return 0


def _phase(asked: str) -> str:
    """A phase as the machines spell it, whatever the case asked; an unknown one is
    refused naming the phases there are."""
    from controlplane.machines.catalog import phase_names

    names = phase_names()
    found = [name for name in names if name.lower() == asked.strip().lower()]
    if not found:
        raise UsageError(f"--phase {asked!r} is not a phase", hint="one of " + ", ".join(names))
    return found[0]


async def list_cmd(args: argparse.Namespace) -> int:
    if args.kind is not None:  # the machines' catalog only then: a plain list reads rows
        from controlplane.machines.catalog import default_kinds

        kinds = default_kinds()
        if args.kind not in kinds:
            raise UsageError(f"--kind {args.kind!r} is not a kind", hint="kinds: "
                             + ", ".join(kinds))
    if args.phase is not None:
        args.phase = _phase(args.phase)
    if args.namespace is not None and not queries.NAMESPACE_NAME.fullmatch(args.namespace):
        raise UsageError(f"--namespace {args.namespace!r} is not a namespace name",
                         hint="a DNS label such as 'default'")
    flt = queries.MachineFilter(kind=args.kind, phase=args.phase,
                                settled=False if args.active else None,
                                since=args.since, node=args.node,
                                namespace=args.namespace, limit=args.limit)
    async with opened(args) as db:
        records = await queries.list_machines(db, flt)
        total = (len(records) if len(records) < args.limit
                 else await queries.count_machines(db, flt))
    if args.output in ("json", "yaml"):
        render.structured({"items": [_record_json(r) for r in records], "total": total,
                           "limit": args.limit}, args.output)
    else:
        from controlplane.app.operation_doc import node_of

        now = clock.now()
        headers = ["id", "kind", "workload", "node", "phase", "age"]
        rows: list[tuple[object, ...]] = [
            (r.id, r.kind, r.workload or "-", node_of(r) or "-", r.phase,
             render.age(r.created_at, now)) for r in records]
        if args.wide:  # as kubectl's -o wide: more columns, every value whole
            headers += ["version", "next wake", "lease owner", "created"]
            rows = [(*row, r.version, r.next_wake_at, r.lease_owner, r.created_at)
                    for row, r in zip(rows, records, strict=True)]
        render.table(headers, rows, wide=args.wide, whole=[0])
        if total > len(records):  # stderr: a pipe reading the table stays clean
            sys.stderr.write(f"showing the newest {len(records)} of {total}; --limit N "
                             "shows more\n")
    return 0


async def history_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.replay import phase_after_each
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import retention

    async with opened(args) as db:
        try:
            record = await queries.get_machine(
                db, await queries.resolve_machine_id(db, args.id))
        except MachineNotFound:
            pruned = await retention.summary(db, args.id)
            if pruned is None:
                raise
            print_pruned(pruned, args.output)  # its summary row, and that it was pruned
            return 0
        events = await queries.history(db, record.id)
    phases = phase_after_each(default_kinds(), record, events)
    if args.output in ("json", "yaml"):
        render.structured([{**_jsonable(e), "phase": p} for e, p in zip(events, phases,
                                                                         strict=True)],
                          args.output)
        return 0
    lines, shown = [], ""
    for e, phase in zip(events, phases, strict=True):
        lines.append(Line(e.seq, e.recorded_at, e.type, phase if phase != shown else "",
                          _reason(e.data), e.worker_id or "", facts_text(e.facts)))
        shown = phase
    if args.wide:  # one row per event, every value whole, on one line each
        headers = ["seq", "time", "phase", "event", "reason", "by", "why (observed facts)"]
        render.table(headers, [(x.seq, x.at, f"-> {x.phase}" if x.phase else "", x.event,
                                " ".join(x.said.split()), x.by, " ".join(x.observed.split()))
                               for x in lines], wide=True)
        return 0
    for text in describe(lines, width=render.terminal_width(sys.stdout),
                         colour=render.colours_on(sys.stdout)):
        print(text)
    return 0


def _jsonable(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = asdict(event)
    return out


def _reason(data: JsonObject) -> str:
    """The event's own words: its reason and message, else its data as ``key=value``
    (its time and a submitted spec left out: the row and ``get`` show them)."""
    reason, message = data.get("reason"), data.get("message")
    if reason or message:
        return ": ".join(str(p) for p in (reason, message) if p)
    return facts_text({k: v for k, v in data.items()
                       if k not in ("at", "spec", "plan") and v != ""})


async def wait_cmd(args: argparse.Namespace) -> int:
    async with opened(args) as db:
        record = await queries.get_machine(db, await queries.resolve_machine_id(db, args.id))
        record = await follow(db, record.id, f"{record.kind} {args.id}",
                              limit_seconds=args.wait_seconds)
    print(f"{args.id}: {record.phase}")
    return 0 if succeeded(record) else 1
