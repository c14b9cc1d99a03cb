"""Monthly partitions of the event history on PostgreSQL.

Migration 0009 makes ``events`` a table partitioned by range of ``recorded_at``, one
partition per UTC month named ``events_yYYYYmMM`` plus ``events_default`` as the safety
net (design and figures: ``docs/partitions.md``). The retention code and the worker's
housekeeping call, and the migration and the schema test use the naming helpers:

- :func:`create_ahead`: make sure the monthly partitions from this month to ``months``
  ahead exist (idempotent, safe from several workers at once: one advisory lock);
- :func:`drop_summarized_before`: drop each monthly partition whose whole range ends
  before ``before`` and every one of whose rows belongs to an operation that already has
  its summary row (pruned), instead of deleting those rows one by one;
- :func:`include_in_schema_compare`: the Alembic ``include_object`` hook that hides what
  partitioning changes (the partitions, the partition key in the unique key) from the
  model comparison.

SQLite keeps plain tables, and a PostgreSQL ``events`` that is not partitioned (below
0009) is left alone: both functions do nothing there.

DDL takes no bind parameters, so the statements that name a partition are built by the
server (``format`` with ``%I`` for names and ``%L`` for bounds, from bound values) and
then run as they came back: nothing is spliced into SQL text here.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store.database import Database
from controlplane.store.session import write_txn

PARENT = "events"
DEFAULT_PARTITION = "events_default"
PARTITION_KEY = "recorded_at"
_MONTHLY = re.compile(r"^events_y(\d{4})m(\d{2})$")
# One cluster-wide key ("cppar"): creating and dropping partitions never run at once.
_ADVISORY_LOCK_KEY = 0x6370706172
# Creating and dropping wait at most this long for a lock, so appends and reads never
# queue behind them for long; a month skipped for it is done on the next run.
_LOCK_TIMEOUT = "2s"
# lock_not_available (the timeout above) and deadlock_detected (a drop takes the
# partition, then ``events``; an append routed to that old month takes them the other way).
_BUSY = ("55P03", "40P01")


def month_start(t: datetime) -> datetime:
    """The first instant of ``t``'s month, in UTC."""
    t = t.astimezone(UTC)
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(month: datetime) -> str:
    """``events_y2026m11`` for any instant of November 2026 (UTC)."""
    m = month_start(month)
    return f"events_y{m.year:04d}m{m.month:02d}"


def is_partition_name(name: str) -> bool:
    return name == DEFAULT_PARTITION or _MONTHLY.match(name) is not None


def include_in_schema_compare(obj: Any, name: str | None, type_: str, reflected: bool,
                              compare_to: Any) -> bool:
    """Alembic ``include_object``: False for what partitioning changes, True otherwise.

    Hidden: the partitions (tables the models do not declare), and a unique constraint or
    index of ``events`` whose partitioned form is the model's columns plus the partition
    key (PostgreSQL requires the key in every unique key of a partitioned table). The
    primary key gains the key as well; Alembic does not compare primary keys.
    """
    if type_ == "table" and reflected and compare_to is None and name is not None:
        return not is_partition_name(name)
    if type_ in ("unique_constraint", "index") and compare_to is not None:
        table = getattr(getattr(obj, "table", None), "name", None)
        if table == PARENT:
            ours, theirs = _columns(obj), _columns(compare_to)
            if [*ours, PARTITION_KEY] == theirs or [*theirs, PARTITION_KEY] == ours:
                return False
    return True


def _columns(constraint: Any) -> list[str]:
    return [getattr(c, "name", str(c)) for c in getattr(constraint, "columns", [])]


async def create_ahead(db: Database, *, now: datetime, months: int = 3) -> list[str]:
    """The partitions created (names), this month's to ``months`` months ahead; none on
    SQLite or while history is not partitioned."""
    if db.backend != "postgresql":
        return []
    first = month_start(now)
    async with write_txn(db) as conn:
        if not await _partitioned_txn(conn):
            return []
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
        # Read under the lock: a worker that waited sees what the other one created.
        existing = set(await partition_bounds_txn(conn))
        await conn.execute(text("SELECT set_config('lock_timeout', :t, true)"),
                           {"t": _LOCK_TIMEOUT})
        created = []
        for n in range(months + 1):
            month = add_months(first, n)
            if partition_name(month) in existing:
                continue
            try:
                async with conn.begin_nested():
                    await create_partition_txn(conn, month)
            except DBAPIError as exc:
                if _sqlstate(exc) not in _BUSY:
                    raise
                continue  # busy (a long read holds the default partition): next run
            created.append(partition_name(month))
        return created


async def drop_summarized_before(db: Database, *, before: datetime) -> list[str]:
    """The partitions dropped (names); none on SQLite or while history is not partitioned.

    A partition is dropped when its range ends at or before ``before`` and none of its
    rows belongs to a machine without a row in ``operation_summaries`` (an empty one
    qualifies). Each drop is its own transaction: the partition is locked against writes
    first (SHARE), then checked, then dropped, so a row appended in between (an import of
    archived history) is either seen by the check or waits and fails on the dropped table.
    """
    if db.backend != "postgresql":
        return []
    async with write_txn(db) as conn:
        if not await _partitioned_txn(conn):
            return []
        summaries = (await conn.execute(text(
            "SELECT to_regclass('operation_summaries') IS NOT NULL"))).scalar_one()
        if not summaries:
            return []
        candidates = [name for name, upper in (await partition_bounds_txn(conn)).items()
                      if upper is not None and upper <= before]
    dropped = []
    for name in sorted(candidates):
        async with write_txn(db) as conn:
            if await _drop_if_summarized_txn(conn, name):
                dropped.append(name)
    return dropped


async def _drop_if_summarized_txn(conn: AsyncConnection, name: str) -> bool:
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
    still_there = (await conn.execute(text("SELECT to_regclass(:name) IS NOT NULL"),
                                      {"name": name})).scalar_one()
    if not still_there:  # another run dropped it since we listed it
        return False
    await conn.execute(text("SELECT set_config('lock_timeout', :t, true)"),
                       {"t": _LOCK_TIMEOUT})
    try:
        async with conn.begin_nested():
            await _run_built(conn, "SELECT format('LOCK TABLE %I IN SHARE MODE', "
                             "CAST(:name AS text))", name=name)
            unsummarized = await _run_built(conn, (
                "SELECT format('SELECT EXISTS (SELECT 1 FROM %I e WHERE NOT EXISTS ("
                "SELECT 1 FROM operation_summaries s WHERE s.machine_id = e.machine_id))', "
                "CAST(:name AS text))"), name=name)
            if unsummarized:
                return False
            await _run_built(conn, "SELECT format('DROP TABLE %I', CAST(:name AS text))",
                             name=name)
            return True
    except DBAPIError as exc:
        if _sqlstate(exc) in _BUSY:  # next run retries
            return False
        raise


async def create_partition_txn(conn: AsyncConnection, month: datetime) -> None:
    """Create ``month``'s partition, moving into it any rows the default partition holds
    for that month (PostgreSQL refuses a new partition while the default has its rows).

    Made as a table of its own and then attached: ``ATTACH PARTITION`` takes only a SHARE
    UPDATE EXCLUSIVE lock on ``events`` (appends and reads go on), where ``CREATE TABLE
    ... PARTITION OF`` would take an ACCESS EXCLUSIVE one. It does lock the default
    partition to check it holds no row of the month, which is why callers bound the wait.
    """
    lo, hi = month_start(month), add_months(month_start(month), 1)
    bounds = {"name": partition_name(lo), "lo": lo, "hi": hi}
    await _run_built(conn, (
        "SELECT format('CREATE TABLE %I (LIKE events INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS INCLUDING STORAGE)', CAST(:name AS text))"),
        name=bounds["name"])
    default = await conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('events') "
        "AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'"))
    default_name = default.scalar_one_or_none()
    if default_name is not None:
        await _run_built(conn, (
            "SELECT format('WITH moved AS (DELETE FROM %I WHERE recorded_at >= %L "
            "AND recorded_at < %L RETURNING *) INSERT INTO %I SELECT * FROM moved', "
            "CAST(:default AS text), CAST(:lo AS timestamptz), CAST(:hi AS timestamptz), "
            "CAST(:name AS text))"), default=default_name, **bounds)
    await _run_built(conn, (
        "SELECT format('ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', "
        "CAST(:name AS text), CAST(:lo AS timestamptz), CAST(:hi AS timestamptz))"), **bounds)


async def partition_bounds_txn(conn: AsyncConnection) -> dict[str, datetime | None]:
    """Each partition of ``events`` and its upper bound (None for the default)."""
    rows = await conn.execute(text(
        "SELECT c.relname, CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), "
        "'TO \\(''([^'']+)''\\)'))[1] AS timestamptz) AS upper "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('events')"))
    return {r.relname: r.upper for r in rows}


async def _partitioned_txn(conn: AsyncConnection) -> bool:
    kind = (await conn.execute(text(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('events')"))).scalar()
    return kind == "p"


async def _run_built(conn: AsyncConnection, builder: str, **values: Any) -> Any:
    """Have the server build a statement from ``values`` (quoted by ``format``), run it,
    and return its first column of its first row (None if it returns no rows)."""
    statement = (await conn.execute(text(builder), values)).scalar_one()
    result = await conn.exec_driver_sql(statement)
    return result.scalar() if result.returns_rows else None


def _sqlstate(exc: DBAPIError) -> str | None:
    for err in (exc.orig, getattr(exc.orig, "__cause__", None)):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(code, str):
            return code
    return None
