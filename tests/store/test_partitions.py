"""Monthly partitions of the history (migration 0009, ``store.partitions``).

On PostgreSQL: the upgrade moves every row and the views answer the same; partitions are
made ahead idempotently and concurrently; a row lands in its month's partition, or in the
default one and moves out when its month is made; only old, fully summarized partitions
are dropped; the downgrade gives back a plain table with the same rows. On SQLite (and on
PostgreSQL below 0009) both functions do nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, MetaData, Table, insert, text
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store import migrate, partitions
from controlplane.store.database import Database, open_database
from tests.conftest import _reset_pg


def _t(year: int, month: int, day: int = 1, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


#: Months of history before the upgrade: three old months, a stray future row, and rows
#: of the kinds the reporting views read.
HISTORY = [_t(2026, 6, 3), _t(2026, 8, 31, 23), _t(2026, 9, 1), _t(2026, 11, 20)]
TYPES = ["Submitted", "CaptureRequested", "ArtifactVerified", "MigrationFinished"]


@pytest.fixture
async def pg(pg_database: str) -> AsyncIterator[Database]:
    """An EMPTY PostgreSQL database (no schema)."""
    await _reset_pg(pg_database)
    database = open_database(pg_database, pool_size=10)
    yield database
    await database.dispose()


async def _machine(db: Database, machine_id: str, *, kind: str = "migration") -> None:
    async with db.writer.begin() as conn:
        await conn.execute(text(
            "INSERT INTO machines (id, kind, phase, version, spec, state, terminal, "
            "pending_actions, wake_seq, attempts, created_at, updated_at, workload) "
            "VALUES (:id, :kind, 'Succeeded', 4, '{}', '{}', true, '[]', 0, 0, :t, :t, :w)"),
            {"id": machine_id, "kind": kind, "t": _t(2026, 6, 1), "w": f"ns/{machine_id}"})


async def _event(db: Database, machine_id: str, seq: int, at: datetime,
                 type_: str = "Submitted") -> None:
    async with db.writer.begin() as conn:
        await conn.execute(text(
            "INSERT INTO events (machine_id, seq, type, data, facts, recorded_at, worker_id) "
            "VALUES (:m, :seq, :type, CAST(:data AS jsonb), '{}', :at, 'w1')"),
            {"m": machine_id, "seq": seq, "type": type_, "at": at,
             "data": '{"checkpoint_id": "c1", "digest": "sha256:1", "reason": "done"}'})


async def _rows(db: Database) -> list[Any]:
    async with db.reader.connect() as conn:
        return list((await conn.execute(text(
            "SELECT to_jsonb(e) FROM events e ORDER BY position"))).scalars())


async def _views(db: Database) -> dict[str, list[Any]]:
    async with db.reader.connect() as conn:
        names = (await conn.execute(text(
            "SELECT viewname FROM pg_views WHERE schemaname = 'public' "
            "ORDER BY viewname"))).scalars().all()
        return {name: await _view_rows(conn, name) for name in names}


async def _view_rows(conn: AsyncConnection, name: str) -> list[Any]:
    """The view's rows as JSON, sorted: the same answer whatever the row order. (The name
    comes from pg_views and is quoted by the server, not spliced here.)"""
    built = (await conn.execute(text(
        "SELECT format('SELECT to_jsonb(v) FROM %I v', CAST(:n AS text))"), {"n": name})
    ).scalar_one()
    rows = (await conn.exec_driver_sql(built)).scalars().all()
    return sorted(rows, key=str)


async def _where(db: Database) -> dict[str, int]:
    async with db.reader.connect() as conn:
        rows = await conn.execute(text(
            "SELECT tableoid::regclass::text AS part, count(*) AS n FROM events GROUP BY 1"))
        return {r.part: r.n for r in rows}


async def _partitioned(db: Database) -> bool:
    async with db.reader.connect() as conn:
        kind = (await conn.execute(text(
            "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('events')"))).scalar()
        return kind == "p"


async def _populate(db: Database) -> None:
    for i, at in enumerate(HISTORY):
        await _machine(db, f"m{i}")
        for seq, type_ in enumerate(TYPES, start=1):
            await _event(db, f"m{i}", seq, at, type_)


@pytest.mark.postgres
async def test_upgrade_moves_every_row_and_the_views_answer_the_same(pg: Database) -> None:
    """Rows written under 0008 are all in the partitioned table after 0009, each in its
    month's partition, with the same content; every view answers as before; positions go
    on from the old sequence."""
    await migrate.upgrade(pg, "0008")
    await _populate(pg)
    rows, views = await _rows(pg), await _views(pg)
    assert len(rows) == 16
    assert views["report_operations"]

    await migrate.upgrade(pg)

    assert await _partitioned(pg)
    assert await _rows(pg) == rows
    assert await _views(pg) == views
    assert await _where(pg) == {"events_y2026m06": 4, "events_y2026m08": 4,
                                "events_y2026m09": 4, "events_y2026m11": 4}
    async with pg.reader.connect() as conn:
        names = set(await partitions.partition_bounds_txn(conn))
    # Every month from the oldest row's to two ahead of now, and the safety net.
    async with pg.reader.connect() as conn:  # the migration's clock: the server's now()
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
    last = partitions.add_months(partitions.month_start(now), 2)
    month = _t(2026, 6)
    while month <= last:
        assert partitions.partition_name(month) in names
        month = partitions.add_months(month, 1)
    assert partitions.DEFAULT_PARTITION in names
    await _event(pg, "m0", 5, _t(2026, 11, 21))
    positions = [r["position"] for r in await _rows(pg)]
    assert positions == sorted(positions)
    assert len(set(positions)) == 17


@pytest.mark.postgres
async def test_downgrade_gives_back_a_plain_table_with_the_same_rows(pg: Database) -> None:
    await migrate.upgrade(pg, "0008")
    await _populate(pg)
    await migrate.upgrade(pg)
    await _event(pg, "m1", 5, _t(2031, 1, 1))  # in the default partition
    rows, views = await _rows(pg), await _views(pg)

    await migrate.downgrade(pg, "0008")

    assert not await _partitioned(pg)
    assert await _rows(pg) == rows
    assert await _views(pg) == views
    async with pg.reader.connect() as conn:
        leftovers = (await conn.execute(text(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'events\\_y%' "
            "OR relname = 'events_default'"))).scalar()
        key = (await conn.execute(text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'uq_events_machine_seq'"))).scalar()
    assert leftovers == 0
    assert key == "UNIQUE (machine_id, seq)"
    await migrate.upgrade(pg)
    assert await _rows(pg) == rows


@pytest.mark.postgres
async def test_create_ahead_creates_each_missing_month_once(pg: Database) -> None:
    await migrate.upgrade(pg)
    now = _t(2027, 5, 14)
    created = await partitions.create_ahead(pg, now=now, months=3)
    assert created == ["events_y2027m05", "events_y2027m06", "events_y2027m07",
                       "events_y2027m08"]
    assert await partitions.create_ahead(pg, now=now, months=3) == []
    assert await partitions.create_ahead(pg, now=_t(2027, 6, 2), months=3) == [
        "events_y2027m09"]


@pytest.mark.postgres
async def test_two_workers_creating_ahead_at_once_create_each_partition_once(
        pg: Database, pg_database: str) -> None:
    """Two workers on their own connections: no error, every month made by exactly one."""
    await migrate.upgrade(pg)
    other = open_database(pg_database, pool_size=2)
    try:
        first, second = await asyncio.gather(
            partitions.create_ahead(pg, now=_t(2028, 1, 1), months=11),
            partitions.create_ahead(other, now=_t(2028, 1, 1), months=11))
    finally:
        await other.dispose()
    expected = [f"events_y2028m{m:02d}" for m in range(1, 13)]
    assert sorted(first + second) == expected
    assert not set(first) & set(second)


@pytest.mark.postgres
async def test_an_event_lands_in_its_month_or_in_the_default_until_its_month_is_made(
        pg: Database) -> None:
    """Inserts never fail for want of a partition: a row past the last one waits in the
    default partition, and making its month moves it there."""
    await migrate.upgrade(pg)
    await _machine(pg, "m")
    await partitions.create_ahead(pg, now=_t(2027, 6, 1), months=1)
    await _event(pg, "m", 1, _t(2027, 7, 10))
    await _event(pg, "m", 2, _t(2030, 2, 3))
    await _event(pg, "m", 3, _t(2030, 2, 28, 23))
    assert (await _where(pg)) == {"events_y2027m07": 1, "events_default": 2}
    before = await _rows(pg)

    assert await partitions.create_ahead(pg, now=_t(2030, 1, 5), months=1) == [
        "events_y2030m01", "events_y2030m02"]

    assert (await _where(pg)) == {"events_y2027m07": 1, "events_y2030m02": 2}
    assert await _rows(pg) == before
    await _event(pg, "m", 4, _t(2030, 2, 28, 23))  # the moved-into partition takes inserts
    assert (await _where(pg))["events_y2030m02"] == 3


async def _summarize(db: Database, machine_id: str) -> None:
    """A summary row for ``machine_id``, read from the table as migrated (its other
    required columns get placeholders: only the row's presence matters to a drop)."""
    placeholders = {str: "x", int: 0, bool: False, dict: {}, datetime: _t(2026, 1, 1)}
    async with db.writer.begin() as conn:
        # Until the retention revision (0008) makes the table, a stand-in of its key.
        await conn.execute(text("CREATE TABLE IF NOT EXISTS operation_summaries "
                                "(machine_id varchar(64) PRIMARY KEY)"))
        table = await conn.run_sync(lambda sync: Table(
            "operation_summaries", MetaData(), autoload_with=sync))
        row: dict[str, Any] = {"machine_id": machine_id}
        for column in table.columns:
            if column.name != "machine_id" and not column.nullable \
                    and column.server_default is None:
                kind = dict if isinstance(column.type, JSON) else column.type.python_type
                row[column.name] = placeholders[kind]
        await conn.execute(insert(table), row)


@pytest.mark.postgres
async def test_drop_summarized_before_drops_only_old_fully_summarized_months(
        pg: Database) -> None:
    """June: all summarized -> dropped. August: one unsummarized machine -> kept.
    November (this month): all summarized but not before the cut -> kept. The default
    partition is never dropped."""
    await migrate.upgrade(pg)
    await partitions.create_ahead(pg, now=_t(2026, 6, 1), months=6)
    for machine_id in ("a", "b", "c", "d"):
        await _machine(pg, machine_id)
    await _event(pg, "a", 1, _t(2026, 6, 2))
    await _event(pg, "b", 1, _t(2026, 6, 9))
    await _event(pg, "a", 2, _t(2026, 8, 2))
    await _event(pg, "c", 1, _t(2026, 8, 3))
    await _event(pg, "d", 1, _t(2026, 11, 3))
    for machine_id in ("a", "b", "d"):
        await _summarize(pg, machine_id)

    dropped = await partitions.drop_summarized_before(pg, before=_t(2026, 11, 15))

    # July, September and October are empty: nothing unsummarized in them either.
    assert dropped == ["events_y2026m06", "events_y2026m07", "events_y2026m09",
                       "events_y2026m10"]
    assert await _where(pg) == {"events_y2026m08": 2, "events_y2026m11": 1}
    assert await partitions.drop_summarized_before(pg, before=_t(2026, 11, 15)) == []
    async with pg.reader.connect() as conn:
        names = set(await partitions.partition_bounds_txn(conn))
    assert partitions.DEFAULT_PARTITION in names
    assert "events_y2026m12" in names


@pytest.mark.postgres
async def test_below_0009_postgresql_history_is_left_alone(pg: Database) -> None:
    await migrate.upgrade(pg, "0008")
    assert await partitions.create_ahead(pg, now=_t(2027, 1, 1)) == []
    assert await partitions.drop_summarized_before(pg, before=_t(2030, 1, 1)) == []
    assert not await _partitioned(pg)


async def test_on_sqlite_both_functions_do_nothing(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        await migrate.upgrade(db)
        assert await partitions.create_ahead(db, now=_t(2027, 1, 1), months=3) == []
        assert await partitions.drop_summarized_before(db, before=_t(2030, 1, 1)) == []
        async with db.reader.connect() as conn:
            tables = (await conn.execute(text(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name LIKE 'events%'"))).scalars().all()
        assert tables == ["events"]
    finally:
        await db.dispose()


def test_names_and_months_are_utc_calendar_months() -> None:
    assert partitions.partition_name(_t(2026, 11, 30, 23)) == "events_y2026m11"
    assert partitions.add_months(_t(2026, 11), 2) == _t(2027, 1)
    assert partitions.add_months(_t(2027, 1), -1) == _t(2026, 12)
    assert partitions.is_partition_name("events_y2026m11")
    assert partitions.is_partition_name("events_default")
    assert not partitions.is_partition_name("events")


@pytest.mark.postgres
async def test_create_ahead_gives_up_a_month_a_long_read_holds_and_makes_it_next_time(
        pg: Database, pg_database: str) -> None:
    """Making a month locks the default partition; behind a reader that holds it, the
    month is skipped after the lock timeout (appends never queue behind the attempt), and
    the next run makes it."""
    await migrate.upgrade(pg)
    reader = open_database(pg_database, pool_size=1)
    try:
        async with reader.reader.connect() as conn, conn.begin():
            await conn.execute(text("SELECT count(*) FROM events"))  # holds every partition
            assert await partitions.create_ahead(pg, now=_t(2029, 3, 1), months=0) == []
    finally:
        await reader.dispose()
    assert await partitions.create_ahead(pg, now=_t(2029, 3, 1), months=0) == [
        "events_y2029m03"]


@pytest.mark.postgres
async def test_two_drops_at_once_drop_each_partition_once(pg: Database,
                                                          pg_database: str) -> None:
    """Two workers pruning together: no error, and each old empty month dropped by one."""
    await migrate.upgrade(pg)
    await partitions.create_ahead(pg, now=_t(2026, 1, 1), months=5)
    await _summarize(pg, "nobody")  # the summaries table exists (or its stand-in)
    other = open_database(pg_database, pool_size=2)
    try:
        first, second = await asyncio.gather(
            partitions.drop_summarized_before(pg, before=_t(2026, 7, 1)),
            partitions.drop_summarized_before(other, before=_t(2026, 7, 1)))
    finally:
        await other.dispose()
    assert sorted(first + second) == [f"events_y2026m{m:02d}" for m in range(1, 7)]
    assert not set(first) & set(second)
