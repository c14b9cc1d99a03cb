"""The verbs of ``cpctl`` on machines and the database: each opens the database, does one
thing, prints the result (``cpctl worker`` is :mod:`controlplane.cli.worker`).

Every verb raises :class:`~controlplane.errors.ControlPlaneError` for anything the
operator can fix; ``main`` turns it into one line on stderr and the documented exit code.
Above are only the imports every verb here needs (the store's queries); the rest (the
machines, the application layer, Alembic) are imported by the verbs that use them, so
``cpctl list`` starts as fast as a read of the store can (issue 38).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from contextlib import closing
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from controlplane.cli import render
from controlplane.cli.context import clock, opened, requester
from controlplane.cli.history import print_pruned
from controlplane.cli.progress import SUCCESS_PHASES, follow
from controlplane.cli.why import facts_text
from controlplane.engine.decider import Command
from controlplane.errors import UsageError
from controlplane.store import queries
from controlplane.store.errors import MachineNotFound

if TYPE_CHECKING:
    from controlplane.app.replay import ReplayReport
    from controlplane.engine.jsonvalue import JsonObject
    from controlplane.store.records import MachineRecord


async def db_upgrade(args: argparse.Namespace) -> int:
    from controlplane.store import migrate

    async with opened(args) as db:
        before, after = await migrate.upgrade(db)
    print(f"schema at {after} (was {before or 'empty'}) on {db.display_url}")
    return 0


async def db_current(args: argparse.Namespace) -> int:
    from controlplane.store import migrate

    async with opened(args) as db:
        current = await migrate.current_revision(db)
    head = migrate.head_revision()
    state = "up to date" if current == head else f"needs upgrade to {head}"
    print(f"schema {current or 'empty'} ({state}) on {db.display_url}")
    return 0 if current == head else 4


def parse_spec(text: str) -> JsonObject:
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read spec file {text[1:]!r}: {exc.strerror}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--spec is not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}", hint='e.g. --spec \'{"steps": 6}\'') from None
    if not isinstance(spec, dict):
        raise UsageError("--spec must be a JSON object", hint='e.g. --spec \'{"steps": 6}\'')
    return spec


#: Kinds ``submit`` takes as raw specs. The product kinds go through their own verbs,
#: which read the pod from the cluster and validate against it.
RAW_KINDS = ("steps",)
PRODUCT_VERBS = {"checkpoint": "checkpoint", "migration": "migrate", "suspend": "suspend",
                 "resume": "resume", "restore": "resume"}


async def submit_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.operations import submit
    from controlplane.clock import new_id
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import migrate

    if args.kind in default_kinds() and args.kind not in RAW_KINDS:
        raise UsageError(f"{args.kind} operations are submitted with their own verb, which "
                         "reads the pod from the cluster and validates the request",
                         hint=f"use `cpctl {PRODUCT_VERBS.get(args.kind, args.kind)} "
                         "NAMESPACE/POD ...` (see its --help)")
    spec = parse_spec(args.spec)
    async with opened(args) as db:
        await migrate.require_current(db)
        machine_id = await submit(db, default_kinds(), kind=args.kind, spec=spec,
                                  machine_id=args.id or new_id(), now=clock.now(),
                                  requester=requester(args))
    print(machine_id)
    return 0


def _record_json(r: MachineRecord) -> dict[str, Any]:
    from controlplane.app.operations import final_pod

    return {
        "id": r.id, "kind": r.kind, "phase": r.phase, "pod": final_pod(r),
        "version": r.version, "terminal": r.terminal, "spec": r.spec, "state": r.state,
        "next_wake_at": r.next_wake_at, "lease_owner": r.lease_owner,
        "lease_expires_at": r.lease_expires_at, "created_at": r.created_at,
        "updated_at": r.updated_at,
    }


async def get_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.drains import drain_children
    from controlplane.machines.drain.state import KIND as DRAIN

    structured = args.output in ("json", "yaml")
    async with opened(args) as db:
        record = await queries.get_machine(db, args.id)
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


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r} is not an ISO time",
                         hint="e.g. --since 2026-11-22T10:00:00Z") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def list_cmd(args: argparse.Namespace) -> int:
    if args.kind is not None:  # the machines' catalog only then: a plain list reads rows
        from controlplane.machines.catalog import default_kinds

        kinds = default_kinds()
        if args.kind not in kinds:
            raise UsageError(f"--kind {args.kind!r} is not a kind", hint="kinds: "
                             + ", ".join(kinds))
    if args.phase is not None and not queries.PHASE_NAME.fullmatch(args.phase):
        raise UsageError(f"--phase {args.phase!r} is not a phase name",
                         hint="e.g. Succeeded, Restoring, Failed")
    if args.namespace is not None and not queries.NAMESPACE_NAME.fullmatch(args.namespace):
        raise UsageError(f"--namespace {args.namespace!r} is not a namespace name",
                         hint="a DNS label such as 'default'")
    flt = queries.MachineFilter(kind=args.kind, phase=args.phase,
                                settled=False if args.active else None,
                                since=_since(args.since), node=args.node,
                                namespace=args.namespace, limit=args.limit)
    async with opened(args) as db:
        records = await queries.list_machines(db, flt)
        total = (len(records) if len(records) < args.limit
                 else await queries.count_machines(db, flt))
    if args.output in ("json", "yaml"):
        render.structured({"items": [_record_json(r) for r in records], "total": total,
                           "limit": args.limit}, args.output)
    else:
        now = clock.now()
        headers = ["id", "kind", "workload", "node", "phase", "age"]
        rows: list[tuple[object, ...]] = [
            (r.id, r.kind, r.workload or "-", r.source_node or "-", r.phase,
             render.age(r.created_at, now)) for r in records]
        if args.wide:  # as kubectl's -o wide: more columns, every value whole
            headers += ["version", "next wake", "lease owner", "created"]
            rows = [(*row, r.version, r.next_wake_at, r.lease_owner, r.created_at)
                    for row, r in zip(rows, records, strict=True)]
        render.table(headers, rows, wide=args.wide, whole=[0])
        if total > len(records):  # stderr: a pipe reading the table stays clean
            print_to_stderr(f"showing the newest {len(records)} of {total}; --limit N "
                            "shows more")
    return 0


async def history_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.replay import phase_after_each
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import retention

    async with opened(args) as db:
        try:
            record = await queries.get_machine(db, args.id)
        except MachineNotFound:
            pruned = await retention.summary(db, args.id)
            if pruned is None:
                raise
            print_pruned(pruned, args.output)  # its summary row, and that it was pruned
            return 0
        events = await queries.history(db, args.id)
    phases = phase_after_each(default_kinds(), record, events)
    if args.output in ("json", "yaml"):
        render.structured([{**_jsonable(e), "phase": p} for e, p in zip(events, phases,
                                                                         strict=True)],
                          args.output)
        return 0
    rows, shown = [], ""
    for e, phase in zip(events, phases, strict=True):
        change = f"-> {phase}" if phase != shown else ""
        shown = phase
        rows.append((e.seq, e.recorded_at, change, e.type, _reason(e.data), e.worker_id,
                     facts_text(e.facts)))
    headers = ["seq", "time", "phase", "event", "reason", "by", "why (observed facts)"]
    render.table(headers, rows, max_width=32, fill=len(headers) - 1, wide=args.wide)
    return 0


def _jsonable(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = asdict(event)
    return out


def _reason(data: JsonObject) -> str:
    """The event's own words: its reason and message, else its data as ``key=value``
    (its time and a submitted spec left out: the row and ``get`` show them)."""
    reason, message = data.get("reason"), data.get("message")
    if reason is not None or message is not None:
        return ": ".join(str(p) for p in (reason, message) if p is not None)
    return facts_text({k: v for k, v in data.items() if k not in ("at", "spec", "plan")})


async def cancel_cmd(args: argparse.Namespace) -> int:
    await _command_then_wait(args, Command("Cancel", {}), "cancel", f"cancel {args.id}")
    return 0  # with --wait: it stopped, whatever phase it stopped in


async def _command_then_wait(args: argparse.Namespace, command: Command, what: str,
                             label: str) -> MachineRecord | None:
    """Record ``command`` for ``args.id``; with ``--wait``, follow it until it settles
    and return the settled record (``None`` without ``--wait``)."""
    from controlplane.app.operations import send_command
    from controlplane.machines.catalog import default_kinds

    async with opened(args) as db:
        version = await send_command(db, default_kinds(), machine_id=args.id,
                                     command=command, now=clock.now(),
                                     requester=requester(args))
        print(f"{what} recorded for {args.id} (version {version})")
        if not args.wait:
            return None
        record = await follow(db, args.id, label, limit_seconds=args.wait_seconds)
    print(f"{args.id}: {record.phase}")
    return record


async def wait_cmd(args: argparse.Namespace) -> int:
    async with opened(args) as db:
        record = await queries.get_machine(db, args.id)
        record = await follow(db, record.id, f"{record.kind} {args.id}",
                              limit_seconds=args.wait_seconds)
    print(f"{args.id}: {record.phase}")
    return 0 if record.phase in SUCCESS_PHASES else 1


async def report_cmd(args: argparse.Namespace) -> int:
    from controlplane.store import migrate, reports

    async with opened(args) as db:
        await migrate.require_current(db)
        summary = await reports.report(db, report=args.report, by=args.by,
                                       since=_since(args.since))
    if args.output in ("json", "yaml"):
        render.structured(summary, args.output)
    elif args.output == "csv":
        writer = csv.writer(sys.stdout)
        if summary:
            writer.writerow(list(summary[0]))
        writer.writerows([list(r.values()) for r in summary])
    else:
        headers = list(summary[0]) if summary else [args.by, "count"]
        render.table(headers, [[_fmt(v) for v in r.values()] for r in summary],
                     wide=args.wide)
    return 0


def _fmt(value: object) -> object:
    return f"{value:.3f}" if isinstance(value, float) else value


async def retarget_cmd(args: argparse.Namespace) -> int:
    record = await _command_then_wait(args, Command("Retarget", {"node": args.to}),
                                      f"retarget to {args.to}",
                                      f"retarget {args.id} to {args.to}")
    return 0 if record is None or record.phase in SUCCESS_PHASES else 1


async def wake_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.operations import wake
    from controlplane.machines.catalog import default_kinds

    async with opened(args) as db:
        ids = (await queries.machines_indexing(db, args.key) if args.key
               else [(await queries.get_machine(db, args.id)).id])
        n = 0
        for machine_id in ids:  # each records who asked (WakeRequested)
            n += await wake(db, default_kinds(), machine_id=machine_id, now=clock.now(),
                            requester=requester(args))
    print(f"woke {n} machine(s)")
    return 0


def _print_report(report: ReplayReport, title: str) -> None:
    print(f"{title}: {report.machines} machines, {report.events} events, "
          f"{report.decisions} decisions, {len(report.mismatches)} mismatches"
          + (f", {report.rewritten} projections rewritten" if report.rewritten else ""))
    for m in report.mismatches[:50]:
        print(f"  {m.machine_id} seq {m.seq} {m.what}: expected {json.dumps(m.expected)} "
              f"got {json.dumps(m.actual)}")


async def replay_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.replay import auto_jobs, rebuild, verify
    from controlplane.cli.meter import RebuildMeter
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import migrate, replay_reads

    kinds = default_kinds()
    dirty = False
    async with opened(args) as db:
        await migrate.require_current(db)
        jobs = args.jobs or auto_jobs(await replay_reads.count_machines(db),
                                      os.cpu_count() or 1)
        title = "rebuild" if args.rebuild else "projections"
        with closing(RebuildMeter(title)) as meter:
            report = await rebuild(db, kinds, now=clock.now(), write=args.rebuild,
                                   jobs=jobs, progress=meter)
        _print_report(report, title)
        dirty |= not report.clean and not args.rebuild
        if args.verify:
            with closing(RebuildMeter("verify")) as meter:
                vreport = await verify(db, kinds, jobs=jobs, progress=meter)
            _print_report(vreport, "verify")
            dirty |= not vreport.clean
    return 5 if dirty else 0


def print_to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
