"""Retention: settled operations older than a policy lose their history but keep a summary.

Called by ``cpctl history prune`` (``cli/retention.py``) and by the worker's housekeeping
(``worker/housekeeping.py``). A prune runs in three phases, each resumable:

1. per batch of prunable machines (settled, older than their policy, oldest first): the
   archive file of the batch when asked (JSON Lines, gzip, temp file + fsync + rename),
   then ONE transaction that re-checks each machine under a lock and inserts its row in
   ``operation_summaries`` (idempotent: ON CONFLICT DO NOTHING);
2. ``partitions.drop_summarized_before`` drops whole partitions where it can, then the
   events, decisions and wake keys of summarized machines are deleted a batch at a time;
3. the machines rows of summarized machines whose history is gone are deleted.

A crash anywhere loses nothing: a summary is committed before any row it stands for is
deleted, and the reporting views count a summarized machine from its summary alone (0008),
so the in-between state reports the same. The next run finishes what a summary row names
(phases 2 and 3 start from the summaries, not from the policy). A summarized machine
that came back to life before its rows were deleted (woken, given a command: its version
moved) loses its summary instead of its history.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, bindparam, delete, exists, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import event_store, partitions, queries, schema
from controlplane.store.database import Database
from controlplane.store.records import DecisionRecord, MachineRecord, RecordedEvent
from controlplane.store.session import read_txn, write_txn

m, s = schema.machines, schema.operation_summaries
ARCHIVE_FORMAT = "cpctl-history-archive/1"
ARCHIVE_READERS = 4  # concurrent reads while archiving (the CLI's pool holds 10)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Policy:
    """Days a settled operation's history is kept: its class's ``history_keep_days``
    first, then ``by_kind[kind]``, then ``default_days``; ``None`` everywhere: kept."""

    default_days: int | None = None
    by_kind: Mapping[str, int] = field(default_factory=dict)

    def days_for(self, kind: str, spec: JsonObject) -> int | None:
        klass = spec.get("class")
        if isinstance(klass, dict):
            days = klass.get("history_keep_days")
            if isinstance(days, int) and not isinstance(days, bool):
                return days
        return self.by_kind.get(kind, self.default_days)

    @property
    def configured(self) -> bool:
        return self.default_days is not None or bool(self.by_kind)


@dataclass
class PruneReport:
    """What a prune did (or, with ``dry_run``, would do)."""

    summarized: int = 0
    events_deleted: int = 0
    decisions_deleted: int = 0
    machines_deleted: int = 0
    revived: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    archives: list[str] = field(default_factory=list)
    batches: int = 0


def settled(row: Mapping[str, Any]) -> bool:
    """Terminal, no pending actions, no lease held, no next wake: nothing will happen."""
    return (bool(row["terminal"]) and not row["pending_actions"]
            and row["lease_owner"] is None and row["next_wake_at"] is None)


async def prune(db: Database, *, policy: Policy, now: datetime, batch: int = 500,
                archive: Path | None = None, dry_run: bool = False,
                progress: Progress | None = None) -> PruneReport:
    """Summarize, then delete, the history of every operation ``policy`` lets go (and
    finish what an interrupted prune summarized)."""
    say = progress or (lambda _line: None)
    report = await summarize(db, policy=policy, now=now, batch=batch, archive=archive,
                             dry_run=dry_run, progress=say)
    if not dry_run:
        await finish(db, before=now - timedelta(days=_least_days(policy)), batch=batch,
                     report=report, progress=say)
    return report


async def summarize(db: Database, *, policy: Policy, now: datetime, batch: int = 500,
                    archive: Path | None = None, dry_run: bool = False,
                    progress: Progress | None = None) -> PruneReport:
    """Phase 1: the summary rows (and archive files) of every prunable operation."""
    say = progress or (lambda _line: None)
    report = PruneReport()
    after: tuple[datetime, str] | None = None
    while True:
        picked, after = await _candidates(db, policy, now, batch, after)
        if not picked:
            return report
        report.batches += 1
        if dry_run:
            report.summarized += len(picked)
            say(f"dry run: batch {report.batches}: {len(picked)} operation(s) would be pruned")
            continue
        if archive is not None:
            report.archives.append(str(await write_archive(db, archive, picked)))
        done = await _summarize_batch(db, policy, now, picked)
        report.summarized += done
        say(f"phase 1 (summaries): batch {report.batches}: {done} of {len(picked)} "
            f"summarized")


async def finish(db: Database, *, before: datetime, batch: int, report: PruneReport,
                 progress: Progress) -> None:
    """Phases 2 and 3 for every summarized machine whose rows still exist (a crashed
    prune's too)."""
    # A revived machine must lose its summary before a partition holding its old events
    # can be dropped as "fully summarized"; phase 2 checks again under its lock.
    last: str | None = None
    while ids := await _summarized_with_history(db, batch, after=last):
        last = ids[-1]
        report.revived += await _forget_revived(db, ids)
    report.partitions_dropped += await partitions.drop_summarized_before(db, before=before)
    n, last = 0, None
    while True:  # phase 2
        ids = await _summarized_with_history(db, batch, after=last)
        if not ids:
            break
        last = ids[-1]
        n += 1
        events_deleted, decisions_deleted, revived = await _delete_history_batch(db, ids)
        report.events_deleted += events_deleted
        report.decisions_deleted += decisions_deleted
        report.revived += revived
        progress(f"phase 2 (history): batch {n}: {events_deleted} event(s), "
                 f"{decisions_deleted} decision(s) of {len(ids) - revived} operation(s) "
                 f"deleted" + (f", {revived} revived kept" if revived else ""))
    n = 0
    while True:  # phase 3
        gone = await _delete_machines_batch(db, batch)
        if not gone:
            break
        n += 1
        report.machines_deleted += gone
        progress(f"phase 3 (machines): batch {n}: {gone} machine row(s) deleted")


def _least_days(policy: Policy) -> int:
    days = [*policy.by_kind.values(), *([policy.default_days] if policy.default_days
                                        is not None else [])]
    return min(days, default=0)


_PICK = (m.c.id, m.c.kind, m.c.spec, m.c.version, m.c.terminal, m.c.pending_actions,
         m.c.lease_owner, m.c.next_wake_at, m.c.updated_at)


def _eligible(row: Mapping[str, Any], policy: Policy, now: datetime) -> bool:
    days = policy.days_for(str(row["kind"]), row["spec"] or {})
    return (days is not None and settled(row)
            and row["updated_at"] <= now - timedelta(days=days))


async def _candidates(db: Database, policy: Policy, now: datetime, batch: int,
                      after: tuple[datetime, str] | None
                      ) -> tuple[list[str], tuple[datetime, str] | None]:
    """Up to ``batch`` prunable machines not yet summarized, oldest settled first, after
    ``after`` (keyset: ``updated_at, id``); and the key to go on from."""
    picked: list[str] = []
    unsummarized = ~exists().where(s.c.machine_id == m.c.id)
    base = (select(*_PICK).where(m.c.terminal.is_(True), m.c.lease_owner.is_(None),
                                 m.c.next_wake_at.is_(None), unsummarized)
            .order_by(m.c.updated_at, m.c.id).limit(batch))
    async with read_txn(db) as conn:
        while len(picked) < batch:
            stmt = base
            if after is not None:
                stmt = stmt.where((m.c.updated_at > after[0])
                                  | and_(m.c.updated_at == after[0], m.c.id > after[1]))
            rows = [dict(r._mapping) for r in (await conn.execute(stmt)).all()]
            for row in rows:
                after = (row["updated_at"], str(row["id"]))
                if _eligible(row, policy, now):
                    picked.append(str(row["id"]))
                    if len(picked) == batch:
                        break
            if len(rows) < batch:
                break
    return picked, after


async def _summarize_batch(db: Database, policy: Policy, now: datetime,
                           ids: Sequence[str]) -> int:
    """Phase 1 of one batch in ONE transaction: re-check under a lock, insert summaries."""
    async with write_txn(db) as conn:
        pick = select(*_PICK).where(m.c.id.in_(ids))
        if db.backend == "postgresql":
            pick = pick.with_for_update()
        rows = [dict(r._mapping) for r in (await conn.execute(pick)).all()]
        still = {str(r["id"]): r for r in rows if _eligible(r, policy, now)}
        if not still:
            return 0
        summaries = await _summaries_txn(conn, db, still, now)
        insert = (pg_insert(s) if db.backend == "postgresql" else sqlite_insert(s))
        await conn.execute(insert.on_conflict_do_nothing(index_elements=["machine_id"]),
                           summaries)
    return len(summaries)


#: What phase 1 reads of each view, for a batch (``IN``) or one machine (``=``): both
#: planners push ``key = :id`` into ``report_migrations``' GROUP BY but not ``key IN``,
#: which would aggregate every event in the database for each batch.
_OPERATIONS = "SELECT * FROM report_operations WHERE operation_id IN :ids"
_CHECKPOINTS = "SELECT * FROM report_checkpoints WHERE operation_id IN :ids"
_DRAINS = "SELECT * FROM report_drains WHERE drain_id IN :ids"
_CHILDREN = "SELECT * FROM report_drain_children WHERE drain_id IN :ids"
_MIGRATION = "SELECT * FROM report_migrations WHERE operation_id = :id"


async def _view_rows(conn: AsyncConnection, sql: str, key: str,
                     ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The rows ``sql`` (one of the constants above) gives for ``ids``, by ``key``."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not ids:
        return out
    if ":ids" in sql:
        rows = (await conn.execute(text(sql).bindparams(
            bindparam("ids", value=list(ids), expanding=True)))).all()
    else:
        rows = [r for machine_id in ids
                for r in (await conn.execute(text(sql), {"id": machine_id})).all()]
    for r in rows:
        row = dict(r._mapping)
        out.setdefault(str(row[key]), []).append(row)
    return out


def _jsonable(row: Mapping[str, Any], drop: Sequence[str] = ()) -> JsonObject:
    """A view row as JSON: times as the view returned them (SQLite: its UTC text;
    PostgreSQL: ISO 8601 with offset), numbers as numbers."""
    out: JsonObject = {}
    for key, value in row.items():
        if key in drop:
            continue
        if isinstance(value, datetime):
            out[key] = value.isoformat()
        elif hasattr(value, "as_tuple"):  # Decimal (PostgreSQL numeric)
            out[key] = float(value)
        elif isinstance(value, str | int | float | bool) or value is None:
            out[key] = value
        else:
            out[key] = str(value)
    return out


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def _summaries_txn(conn: AsyncConnection, db: Database,
                         machines: Mapping[str, Mapping[str, Any]],
                         now: datetime) -> list[dict[str, Any]]:
    """The summary rows of ``machines`` from what the reporting views show of them."""
    ids = sorted(machines)
    of_kind = {kind: [i for i in ids if machines[i]["kind"] == kind]
               for kind in ("migration", "drain")}
    ops = await _view_rows(conn, _OPERATIONS, "operation_id", ids)
    migrations = await _view_rows(conn, _MIGRATION, "operation_id", of_kind["migration"])
    checkpoints = await _view_rows(conn, _CHECKPOINTS, "operation_id", ids)
    drains = await _view_rows(conn, _DRAINS, "drain_id", of_kind["drain"])
    children = await _view_rows(conn, _CHILDREN, "drain_id", of_kind["drain"])
    first = (select(schema.events.c.machine_id, schema.events.c.worker_id)
             .where(schema.events.c.machine_id.in_(ids), schema.events.c.seq == 1))
    asked = {str(r[0]): str(r[1]) for r in (await conn.execute(first)).all()}
    out = []
    for machine_id in ids:
        machine = machines[machine_id]
        op = _first(ops, machine_id)
        if op is None:
            continue  # not in report_operations: nothing to keep figures for
        migration = _first(migrations, machine_id)
        spec = machine["spec"] or {}
        target = (migration or {}).get("target_node") or spec.get("target_node") \
            or spec.get("node")
        sizes = [int(c["size_bytes"]) for c in checkpoints.get(machine_id, [])
                 if c["size_bytes"] is not None]
        drain = _first(drains, machine_id)
        milestones: JsonObject = {
            "version": int(machine["version"]),
            "operation": _jsonable(op),
            "migration": _jsonable(migration) if migration else None,
            "checkpoints": [_jsonable(c, drop=("operation_id",))
                            for c in checkpoints.get(machine_id, [])],
            "drain": _jsonable(drain, drop=("children", "succeeded", "failed", "in_flight"))
            if drain else None,
            "drain_children": [_jsonable(c, drop=("drain_id",))
                               for c in children.get(machine_id, [])],
        }
        out.append({
            "machine_id": machine_id, "kind": op["kind"], "workload": op["workload"],
            "source_node": op["source_node"],
            "target_node": None if target is None else str(target),
            "final_node": (migration or {}).get("final_node"),
            "outcome": op["outcome"], "reason": op["finish_reason"],
            "message": op["finish_message"], "class_name": op["class_name"],
            "requester": asked.get(machine_id),
            "submitted_at": _time(op["submitted_at"]), "finished_at": _time(op["finished_at"]),
            "events": int(op["events"]),
            "bytes": (migration or {}).get("size_bytes") if migration
            else (max(sizes) if sizes else None),
            "milestones": milestones, "pruned_at": now,
        })
    del db
    return out


def _first(rows: Mapping[str, list[dict[str, Any]]], key: str) -> dict[str, Any] | None:
    found = rows.get(key)
    return found[0] if found else None


async def _summarized_with_history(db: Database, batch: int, *, after: str | None
                                   ) -> list[str]:
    stmt = (select(s.c.machine_id).join(m, m.c.id == s.c.machine_id)
            .order_by(s.c.machine_id).limit(batch))
    if after is not None:
        stmt = stmt.where(s.c.machine_id > after)
    async with read_txn(db) as conn:
        return [str(r[0]) for r in (await conn.execute(stmt)).all()]


async def _revived_txn(conn: AsyncConnection, db: Database, ids: Sequence[str]
                       ) -> tuple[list[str], list[str]]:
    """Of summarized ``ids`` (locked on PostgreSQL): (those still as summarized, those
    that moved since, whose summaries are deleted: their history stays)."""
    pick = (select(*_PICK, s.c.milestones).join(s, s.c.machine_id == m.c.id)
            .where(m.c.id.in_(ids)))
    if db.backend == "postgresql":
        pick = pick.with_for_update(of=m)
    rows = [dict(r._mapping) for r in (await conn.execute(pick)).all()]
    revived = [str(r["id"]) for r in rows if not settled(r)
               or (r["milestones"] or {}).get("version") != r["version"]]
    if revived:
        await conn.execute(delete(s).where(s.c.machine_id.in_(revived)))
    return [str(r["id"]) for r in rows if str(r["id"]) not in revived], revived


async def _forget_revived(db: Database, ids: Sequence[str]) -> int:
    async with write_txn(db) as conn:
        return len((await _revived_txn(conn, db, ids))[1])


async def _delete_history_batch(db: Database, ids: Sequence[str]) -> tuple[int, int, int]:
    """Phase 2 of one batch: (events, decisions deleted, machines revived)."""
    async with write_txn(db) as conn:
        gone, revived = await _revived_txn(conn, db, ids)
        if not gone:
            return 0, 0, len(revived)
        events = await conn.execute(delete(schema.events)
                                    .where(schema.events.c.machine_id.in_(gone)))
        decisions = await conn.execute(delete(schema.decisions)
                                       .where(schema.decisions.c.machine_id.in_(gone)))
        await conn.execute(delete(schema.machine_keys)
                           .where(schema.machine_keys.c.machine_id.in_(gone)))
    return int(events.rowcount or 0), int(decisions.rowcount or 0), len(revived)


async def _delete_machines_batch(db: Database, batch: int) -> int:
    """Phase 3 of one batch: machines rows that have a summary and no history left."""
    no_history = and_(~exists().where(schema.events.c.machine_id == m.c.id),
                      ~exists().where(schema.decisions.c.machine_id == m.c.id),
                      ~exists().where(schema.machine_keys.c.machine_id == m.c.id))
    async with write_txn(db) as conn:
        ids = [str(r[0]) for r in (await conn.execute(
            select(m.c.id).join(s, s.c.machine_id == m.c.id).where(no_history)
            .order_by(m.c.id).limit(batch))).all()]
        if not ids:
            return 0
        await conn.execute(delete(m).where(m.c.id.in_(ids)))
    return len(ids)


# -- reading summaries ---------------------------------------------------------------


async def summary(db: Database, machine_id: str) -> dict[str, Any] | None:
    """The summary row of a pruned operation (``cpctl history ID``), or ``None``."""
    if "\x00" in machine_id:
        return None
    async with read_txn(db) as conn:
        row = (await conn.execute(select(s).where(s.c.machine_id == machine_id))).first()
    return None if row is None else dict(row._mapping)


async def count_summaries(db: Database) -> int:
    async with read_txn(db) as conn:
        return int((await conn.execute(select(func.count()).select_from(s))).scalar_one())


# -- the archive ---------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def archive_name(ids: Sequence[str]) -> str:
    """The file of a batch: named by its machines, so a rerun of the same batch (a crash
    before its summaries committed) rewrites the same file instead of adding one."""
    digest = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:20]
    return f"history-{digest}.jsonl.gz"


async def write_archive(db: Database, directory: Path, ids: Sequence[str]) -> Path:
    """One line per operation (in id order): its machine row, events and decisions
    (decoded), written to a temp file, fsynced, renamed into place, and the directory
    fsynced."""
    # Through the store's decoding reads, a few machines at a time (each read is its
    # own round trip; one after another they made archiving 6x slower than pruning).
    gate = asyncio.Semaphore(ARCHIVE_READERS)

    async def line(machine_id: str) -> str:
        async with gate:
            record = await queries.get_machine(db, machine_id)
            events = await queries.history(db, machine_id)
            decisions = await queries.decisions(db, machine_id)
        return json.dumps({
            "format": ARCHIVE_FORMAT, "machine": asdict(record),
            "events": [asdict(e) for e in events], "decisions": [asdict(d) for d in decisions],
        }, default=_encode, sort_keys=True)

    lines = await asyncio.gather(*(line(i) for i in sorted(ids)))
    return await asyncio.to_thread(_write_durably, directory, archive_name(ids),
                                   ("\n".join(lines) + "\n").encode())


def _write_durably(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    tmp = directory / f".{name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(data)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


@dataclass(frozen=True)
class Archived:
    """One operation read back from an archive."""

    record: MachineRecord
    events: list[RecordedEvent]
    decisions: list[DecisionRecord]


def _build(cls: type[Any], data: Mapping[str, Any]) -> Any:
    values = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(value, str) and f.name.endswith(("_at",)):
            value = datetime.fromisoformat(value)
        values[f.name] = value
    return cls(**values)


def read_archive(path: Path) -> list[Archived]:
    """Every operation in one archive file (``ValueError`` naming the line if malformed)."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if item.get("format") != ARCHIVE_FORMAT:
                    raise ValueError(f"format {item.get('format')!r}, not {ARCHIVE_FORMAT}")
                out.append(Archived(
                    _build(MachineRecord, item["machine"]),
                    [_build(RecordedEvent, e) for e in item["events"]],
                    [_build(DecisionRecord, d) for d in item["decisions"]]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: line {n}: not a history archive entry ({exc})"
                                 ) from None
    return out


async def import_archived(db: Database, item: Archived) -> bool:
    """Put one archived operation back (machine, events, decisions) and remove its
    summary, in one transaction; ``False`` when its machine is already there."""
    async with write_txn(db) as conn:
        present = (await conn.execute(select(m.c.id).where(m.c.id == item.record.id))).first()
        if present is not None:
            return False
        await event_store.restore_history_txn(conn, item.record, item.events, item.decisions)
        await conn.execute(delete(s).where(s.c.machine_id == item.record.id))
    return True

