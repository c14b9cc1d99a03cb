"""Read side of the store: one machine, lists with filters, a history, replay streams."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, and_, case, func, or_, select

from controlplane.engine.decider import Cause
from controlplane.engine.events import ActionFailed
from controlplane.errors import UsageError
from controlplane.store import codec, schema
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound
from controlplane.store.leases import row_to_record
from controlplane.store.records import DecisionRecord, MachineRecord, RecordedEvent
from controlplane.store.session import read_txn

m = schema.machines
e = schema.events
d = schema.decisions


async def machines_indexing(db: Database, key: str) -> list[str]:
    """The live machines that indexed ``key`` (a pod UID, ``namespace/name``...): who a
    wake by that key reaches."""
    k, m = schema.machine_keys, schema.machines
    stmt = (select(k.c.machine_id).join(m, m.c.id == k.c.machine_id)
            .where(k.c.key == key, m.c.terminal.is_(False)).order_by(k.c.machine_id))
    async with read_txn(db) as conn:
        return [str(r[0]) for r in await conn.execute(stmt)]


def _event(row: Row[tuple[object, ...]]) -> RecordedEvent:
    r = row._mapping
    return RecordedEvent(
        position=r["position"], machine_id=r["machine_id"], seq=r["seq"], type=r["type"],
        data=r["data"], facts=codec.from_columns(r["facts"], r["facts_z"]),
        recorded_at=r["recorded_at"],
        worker_id=r["worker_id"],
    )


def _decision(row: Row[tuple[object, ...]]) -> DecisionRecord:
    """A row of the ``decisions`` table (written before revision 0007)."""
    r = row._mapping
    return DecisionRecord(r["machine_id"], r["first_seq"], Cause(r["cause"]), r["input"],
                          r["decided_at"])


def _event_decision(event: RecordedEvent, row: Row[tuple[object, ...]]) -> DecisionRecord | None:
    """The decision recorded on ``event``'s row (since revision 0007), if it starts one."""
    r = row._mapping
    if r["cause"] is None:
        return None
    return DecisionRecord(event.machine_id, event.seq, Cause(r["cause"]),
                          codec.decode(r["input_z"]), event.recorded_at)


def _merged(legacy: list[DecisionRecord], recorded: list[DecisionRecord]) -> list[DecisionRecord]:
    """A machine's decisions from both places, in seq order (a machine written across the
    upgrade has its first decisions in ``decisions`` and the later ones on events)."""
    if not legacy:
        return recorded
    return sorted([*legacy, *recorded], key=lambda d: d.first_seq)


async def recorded_operation_ids(db: Database, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` the history records: an operation's machine, or the summary a
    prune left of it (``operation_summaries``)."""
    wanted = sorted({i for i in ids if "\x00" not in i})
    found: set[str] = set()
    async with read_txn(db) as conn:
        for start in range(0, len(wanted), 500):  # bounded IN lists
            chunk = wanted[start:start + 500]
            for table, column in ((m, m.c.id), (schema.operation_summaries,
                                                schema.operation_summaries.c.machine_id)):
                rows = await conn.execute(select(column).select_from(table)
                                          .where(column.in_(chunk)))
                found.update(str(r[0]) for r in rows)
    return found


async def get_machine(db: Database, machine_id: str) -> MachineRecord:
    # PostgreSQL text cannot hold NUL, so no stored id has one; asking the server anyway
    # is an encoding error (a 500 from the API), not an answer.
    row = None
    if "\x00" not in machine_id:
        async with read_txn(db) as conn:
            row = (await conn.execute(select(m).where(m.c.id == machine_id))).first()
    if row is None:
        raise MachineNotFound(
            f"no operation with id {machine_id!r}", hint="list ids with `cpctl list`"
        )
    return row_to_record(row)


#: The shortest prefix taken for an id (the dashboard shows 8 characters).
MIN_ID_PREFIX = 4


#: How the dashboard shortens a drain child's id (``<drain id>-<12 hex>``): its end.
ELLIPSES = ("\u2026", "...")


async def resolve_machine_id(db: Database, asked: str) -> str:
    """The id of the operation ``asked`` names: its whole id, a unique prefix of at least
    :data:`MIN_ID_PREFIX` characters, or the end of one after an ellipsis (``…b534430ca581``,
    as the dashboard shows a drain's child). A prefix that names a drain and its children
    (whose ids begin with the drain's) names the drain. Any other ambiguity is refused
    listing the candidates (``UsageError``); none is ``MachineNotFound``."""
    if "\x00" in asked:
        raise MachineNotFound(f"no operation with id {asked!r}",
                              hint="list ids with `cpctl list`")
    tail = next((asked[len(e):] for e in ELLIPSES if asked.startswith(e)), None)
    async with read_txn(db) as conn:
        if (await conn.execute(select(m.c.id).where(m.c.id == asked))).first() is not None:
            return asked
        found: list[str] = []
        wanted = tail if tail is not None else asked
        if len(wanted) >= MIN_ID_PREFIX:
            pattern = ("%" + _like_escaped(wanted)) if tail is not None else (
                _like_escaped(wanted) + "%")
            found = [str(r[0]) for r in await conn.execute(
                select(m.c.id).where(m.c.id.like(pattern, escape="\\"))
                .order_by(m.c.id).limit(6))]
        if len(found) > 1 and tail is None:
            parent = found[0]  # a drain sorts before its children
            others = select(m.c.id).where(
                m.c.id.like(_like_escaped(asked) + "%", escape="\\"), m.c.id != parent,
                m.c.id.not_like(_like_escaped(parent) + "-%", escape="\\")).limit(1)
            if (await conn.execute(others)).first() is None:
                return parent
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise UsageError(f"id {'end' if tail is not None else 'prefix'} {asked!r} names more "
                         f"than one operation: {shown}", hint="give more characters of the id")
    raise MachineNotFound(f"no operation with id {asked!r}", hint="list ids with `cpctl list`")


def _like_escaped(text: str) -> str:
    """``text`` matched literally in a LIKE pattern: ``%``, ``_`` and ``\\`` escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def machine_versions(db: Database, ids: Sequence[str]) -> dict[str, int]:
    """The version of each machine of ``ids`` that exists (absent ids are left out): how
    the front door's mirror learns, in one query per 500, which operations moved."""
    versions: dict[str, int] = {}
    wanted = [i for i in dict.fromkeys(ids) if "\x00" not in i]
    async with read_txn(db) as conn:
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            rows = await conn.execute(select(m.c.id, m.c.version).where(m.c.id.in_(chunk)))
            versions.update({str(r.id): int(r.version) for r in rows})
    return versions


@dataclass(frozen=True)
class MachineFilter:
    """``settled=False``: machines that still need a worker — not terminal, or terminal
    but with a lease held or a wake pending (e.g. a dead worker's outbox to perform)."""

    kind: str | None = None
    phase: str | None = None
    terminal: bool | None = None
    settled: bool | None = None
    since: datetime | None = None
    node: str | None = None  # the node it moves load off, or the node it targets
    namespace: str | None = None  # of the workload
    limit: int = 100
    offset: int = 0  # skip this many of the ordered matches (a page further on)
    order: str = "-created_at"  # a key of ORDERS, "-" first for descending


#: What a phase name looks like (a filter that cannot match one is refused, not run).
PHASE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: What a namespace looks like (a DNS label).
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: Spec fields naming the node an operation puts a workload on.
TARGET_FIELDS = ("target_node", "node")


def _where(stmt: Select[Any], flt: MachineFilter) -> Select[Any]:
    """``stmt`` narrowed to the machines ``flt`` selects (its limit aside)."""
    if flt.kind is not None:
        stmt = stmt.where(m.c.kind == flt.kind)
    if flt.phase is not None:
        stmt = stmt.where(m.c.phase == flt.phase)
    if flt.terminal is not None:
        stmt = stmt.where(m.c.terminal.is_(flt.terminal))
    if flt.settled is not None:
        unsettled = or_(m.c.terminal.is_(False), m.c.next_wake_at.is_not(None),
                        m.c.lease_owner.is_not(None))
        stmt = stmt.where(~unsettled if flt.settled else unsettled)
    if flt.since is not None:
        stmt = stmt.where(m.c.created_at >= flt.since)
    if flt.node is not None:
        stmt = stmt.where(or_(m.c.source_node == flt.node,
                              *(m.c.spec[f].as_string() == flt.node for f in TARGET_FIELDS)))
    if flt.namespace is not None:
        stmt = stmt.where(m.c.workload.startswith(flt.namespace + "/", autoescape=True))
    return stmt


#: What ``MachineFilter.order`` may sort by (then newest first, then by id).
ORDERS = {"created_at": m.c.created_at, "kind": m.c.kind, "phase": m.c.phase,
          "workload": m.c.workload, "node": m.c.source_node, "id": m.c.id}


async def list_machines(db: Database, flt: MachineFilter) -> list[MachineRecord]:
    """``flt.limit`` machines ``flt`` selects, in ``flt.order`` (default newest first),
    after skipping ``flt.offset``; ties newest first, then by id, so pages never overlap."""
    key = flt.order.removeprefix("-")
    if key not in ORDERS:
        raise ValueError(f"order {flt.order!r}: sort by one of {', '.join(ORDERS)}")
    column = ORDERS[key]
    first = (column.desc() if flt.order.startswith("-") else column.asc()).nulls_last()
    stmt = (_where(select(m), flt).order_by(first, m.c.created_at.desc(), m.c.id)
            .offset(flt.offset).limit(flt.limit))
    async with read_txn(db) as conn:
        return [row_to_record(r) for r in (await conn.execute(stmt)).all()]


async def count_machines(db: Database, flt: MachineFilter) -> int:
    """How many machines ``flt`` selects, its limit aside (``cpctl list``'s "of N")."""
    stmt = _where(select(func.count()).select_from(m), flt)
    async with read_txn(db) as conn:
        return int((await conn.execute(stmt)).scalar_one())


async def history(db: Database, machine_id: str) -> list[RecordedEvent]:
    """All events of one machine in ``seq`` order (raises if the machine is unknown)."""
    await get_machine(db, machine_id)
    async with read_txn(db) as conn:
        rows = (await conn.execute(select(e).where(e.c.machine_id == machine_id)
                                   .order_by(e.c.seq))).all()
    return [_event(r) for r in rows]


@dataclass(frozen=True)
class VerifiedCapture:
    """A machine whose capture the registry verified: the machine (its spec holds the pod
    and the class) and the ``ArtifactVerified`` event's data (``pinned``, ``digest``)."""

    machine: MachineRecord
    verified: dict[str, object]
    verified_at: datetime


async def verified_captures(db: Database, *, workload: str | None = None,
                            machine_id: str | None = None) -> list[VerifiedCapture]:
    """Machines with a verified capture (checkpoints, suspends, migrations), newest
    verification first, optionally of one workload or one machine: one query."""
    stmt = (select(m, e.c.data.label("verified_data"), e.c.recorded_at.label("verified_at"))
            .join(e, and_(e.c.machine_id == m.c.id, e.c.type == "ArtifactVerified"))
            .order_by(e.c.recorded_at.desc(), m.c.id))
    if workload is not None:
        stmt = stmt.where(m.c.workload == workload)
    if machine_id is not None:
        stmt = stmt.where(m.c.id == machine_id)
    async with read_txn(db) as conn:
        rows = (await conn.execute(stmt)).all()
    return [VerifiedCapture(row_to_record(r), dict(r.verified_data), r.verified_at)
            for r in rows]


async def decisions(db: Database, machine_id: str) -> list[DecisionRecord]:
    """A machine's decision records in seq order, wherever they are stored."""
    async with read_txn(db) as conn:
        rows = (await conn.execute(select(d).where(d.c.machine_id == machine_id)
                                   .order_by(d.c.first_seq))).all()
        starts = (await conn.execute(select(e).where(e.c.machine_id == machine_id,
                                                     e.c.cause.is_not(None))
                                     .order_by(e.c.seq))).all()
    recorded = [_event_decision(_event(r), r) for r in starts]
    return _merged([_decision(r) for r in rows], [x for x in recorded if x is not None])


async def count_by_phase(db: Database) -> dict[tuple[str, str], int]:
    stmt = select(m.c.kind, m.c.phase, func.count()).group_by(m.c.kind, m.c.phase)
    async with read_txn(db) as conn:
        return {(k, p): int(n) for k, p, n in (await conn.execute(stmt)).all()}


async def events_by_kind(db: Database) -> dict[str, int]:
    """How many events each machine kind has recorded (its transitions)."""
    stmt = (select(m.c.kind, func.count()).select_from(e.join(m, e.c.machine_id == m.c.id))
            .group_by(m.c.kind))
    async with read_txn(db) as conn:
        return {k: int(n) for k, n in (await conn.execute(stmt)).all()}


async def queue_depth(db: Database, now: datetime) -> dict[str, int]:
    """Machines held in the admission queue, due and unclaimed, and leased."""
    unleased = or_(m.c.lease_expires_at.is_(None), m.c.lease_expires_at <= now)
    stmt = select(
        func.coalesce(func.sum(case((m.c.held.is_(True), 1), else_=0)), 0),
        func.coalesce(func.sum(case((and_(m.c.held.is_(False), m.c.next_wake_at <= now,
                                          unleased), 1), else_=0)), 0),
        func.coalesce(func.sum(case((~unleased, 1), else_=0)), 0),
    )
    async with read_txn(db) as conn:
        held, due, leased = (await conn.execute(stmt)).one()
    return {"admission": int(held), "due": int(due), "leased": int(leased)}


async def action_failures(db: Database) -> dict[tuple[str, str], int]:
    """``ActionFailed`` events by (action type, error class)."""
    stmt = select(e.c.data).where(e.c.type == ActionFailed.NAME)
    out: dict[tuple[str, str], int] = {}
    async with read_txn(db) as conn:
        for (data,) in (await conn.execute(stmt)).all():
            if not isinstance(data, dict):
                continue
            key = (str(data.get("action") or "unknown"), str(data.get("error_class")
                                                                 or "unknown"))
            out[key] = out.get(key, 0) + 1
    return out


async def machine_ids(db: Database, *, after: str = "", limit: int = 1000) -> list[str]:
    stmt = select(m.c.id).where(m.c.id > after).order_by(m.c.id).limit(limit)
    async with read_txn(db) as conn:
        return list((await conn.scalars(stmt)).all())


async def stream_histories(
    db: Database, *, batch_machines: int = 500, after: str = "", until: str | None = None,
) -> AsyncIterator[tuple[MachineRecord, list[RecordedEvent], list[DecisionRecord]]]:
    """Every machine with its events and decisions, in id order, a batch at a time;
    ``after``/``until``: only ids in ``(after, until]`` (a parallel verify's share).

    Replay's read path: one query per batch for events and one for decisions, so reading
    1M events costs ~2 round trips per ``batch_machines`` machines, not one per machine.
    """
    while True:
        pick = select(m).where(m.c.id > after)
        if until is not None:
            pick = pick.where(m.c.id <= until)
        async with read_txn(db) as conn:
            rows = (await conn.execute(pick.order_by(m.c.id).limit(batch_machines))).all()
            if not rows:
                return
            records = [row_to_record(r) for r in rows]
            first, last = records[0].id, records[-1].id
            ev_rows = (await conn.execute(
                select(e).where(e.c.machine_id >= first, e.c.machine_id <= last)
                .order_by(e.c.machine_id, e.c.seq)
            )).all()
            dec_rows = (await conn.execute(
                select(d).where(d.c.machine_id >= first, d.c.machine_id <= last)
                .order_by(d.c.machine_id, d.c.first_seq)
            )).all()
        by_machine: dict[str, list[RecordedEvent]] = {r.id: [] for r in records}
        on_events: dict[str, list[DecisionRecord]] = {r.id: [] for r in records}
        for row in ev_rows:
            ev = _event(row)
            by_machine[ev.machine_id].append(ev)
            started = _event_decision(ev, row)
            if started is not None:
                on_events[ev.machine_id].append(started)
        dec_by: dict[str, list[DecisionRecord]] = {r.id: [] for r in records}
        for row in dec_rows:
            dec = _decision(row)
            dec_by[dec.machine_id].append(dec)
        for record in records:
            yield (record, by_machine[record.id],
                   _merged(dec_by[record.id], on_events[record.id]))
        after = last
