"""Monthly partitions of the event history on PostgreSQL (issue 26, part 3).

On PostgreSQL ``events`` becomes a table partitioned by range of ``recorded_at``: one
partition per UTC month (``events_y2026m11``) from the oldest row's month to two months
ahead of now (or of the newest row), and ``events_default`` as the safety net for a row
whose month has no partition yet (``store.partitions.create_ahead`` makes them ahead and
moves such rows out). The new table is made from the old one (``LIKE ... INCLUDING ALL
EXCLUDING INDEXES``), so columns other revisions add come along; its rows are copied with
INSERT ... SELECT (52 s for ten million rows on the 2-core machine: the upgrade holds
the table meanwhile).

A partitioned table's unique keys must contain the partition key: the primary key becomes
``(position, recorded_at)`` (``position`` keeps its sequence) and ``uq_events_machine_seq``
becomes ``(machine_id, seq, recorded_at)``, which also serves per-machine reads. What keeps
a machine's ``seq`` unique is the optimistic check on ``machines.version`` that guards every
append (``store.event_store``); the unique key was its second guard and now refuses only a
duplicate recorded at the same instant. Other indexes and the foreign key to ``machines``
are recreated as they were. The views that read ``events`` (``report_*``, whichever
exist) are captured with ``pg_get_viewdef``, dropped, and recreated in dependency order
(``migrations/dependent_views.py``).

``decisions`` is not partitioned: since revision 0007 no row is added to it (a decision is
recorded on its first event), so it only shrinks as retention prunes old operations; a
fixed, shrinking table gains nothing from partitions, and partitioning it would put
``decided_at`` in its primary key for no reader's benefit.

SQLite keeps plain tables. The downgrade copies the rows back into a plain table.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from typing import NamedTuple

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

from controlplane.store.partitions import (
    DEFAULT_PARTITION,
    PARTITION_KEY,
    add_months,
    month_start,
    partition_name,
)
from migrations.dependent_views import View, create_views, dependent_views, drop_views
from migrations.dependent_views import run as _run_on

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

MONTHS_AHEAD = 2
_NEW = "events_0009_new"


class _Shape(NamedTuple):
    """What of ``events`` is not carried by ``LIKE``: keys, indexes, foreign keys."""

    primary: tuple[str, list[str]]
    uniques: list[tuple[str, list[str]]]
    indexes: list[str]  # CREATE INDEX statements
    foreign_keys: list[tuple[str, str]]  # (name, definition)
    columns: list[str]  # quoted, in order


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or _partitioned(bind):
        return
    views = dependent_views(bind, ["events"])
    drop_views(op.get_bind(), views)
    shape = _shape(bind)
    oldest, newest, now = bind.execute(sa.text(
        "SELECT min(recorded_at), max(recorded_at), now() FROM events")).one()
    first = month_start(oldest or now)
    last = max(add_months(month_start(now), MONTHS_AHEAD), month_start(newest or now))

    _run(f"CREATE TABLE {_NEW} (LIKE events INCLUDING ALL EXCLUDING INDEXES) "
               f"PARTITION BY RANGE ({PARTITION_KEY})")
    month = first
    while month <= last:
        _run(f"CREATE TABLE {partition_name(month)} PARTITION OF {_NEW} FOR VALUES "
                   f"FROM ('{month.isoformat()}') TO ('{add_months(month, 1).isoformat()}')")
        month = add_months(month, 1)
    _run(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {_NEW} DEFAULT")
    columns = ", ".join(shape.columns)
    _run(f"INSERT INTO {_NEW} ({columns}) SELECT {columns} FROM events")
    _replace(bind, _NEW)

    pk_name, pk_cols = shape.primary
    _run(f"ALTER TABLE events ADD CONSTRAINT {pk_name} PRIMARY KEY "
               f"({', '.join(_with_key(pk_cols))})")
    for name, cols in shape.uniques:
        _run(f"ALTER TABLE events ADD CONSTRAINT {name} UNIQUE "
                   f"({', '.join(_with_key(cols))})")
    _finish(shape, views)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or not _partitioned(bind):
        return
    views = dependent_views(bind, ["events"])
    drop_views(op.get_bind(), views)
    shape = _shape(bind)
    _run(f"CREATE TABLE {_NEW} (LIKE events INCLUDING ALL EXCLUDING INDEXES)")
    columns = ", ".join(shape.columns)
    _run(f"INSERT INTO {_NEW} ({columns}) SELECT {columns} FROM events")
    _replace(bind, _NEW)

    pk_name, pk_cols = shape.primary
    _run(f"ALTER TABLE events ADD CONSTRAINT {pk_name} PRIMARY KEY "
               f"({', '.join(_without_key(pk_cols))})")
    for name, cols in shape.uniques:
        _run(f"ALTER TABLE events ADD CONSTRAINT {name} UNIQUE "
                   f"({', '.join(_without_key(cols))})")
    _finish(shape, views)


def _run(sql: str) -> None:
    _run_on(op.get_bind(), sql)


def _with_key(cols: list[str]) -> list[str]:
    return cols if PARTITION_KEY in cols else [*cols, PARTITION_KEY]


def _without_key(cols: list[str]) -> list[str]:
    return [c for c in cols if c != PARTITION_KEY] or cols


def _partitioned(bind: Connection) -> bool:
    kind = bind.execute(sa.text(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('events')")).scalar_one()
    return bool(kind == "p")


def _shape(bind: Connection) -> _Shape:
    constraints = bind.execute(sa.text("""
        SELECT quote_ident(con.conname) AS conname, con.contype::text AS contype,
               pg_get_constraintdef(con.oid) AS definition,
               ARRAY(SELECT quote_ident(a.attname)
                     FROM unnest(con.conkey) WITH ORDINALITY k(num, ord)
                     JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num
                     ORDER BY k.ord)::text[] AS cols
        FROM pg_constraint con
        WHERE con.conrelid = 'events'::regclass AND con.contype IN ('p', 'u', 'f')
        ORDER BY con.conname
    """)).all()
    indexes = bind.execute(sa.text("""
        SELECT pg_get_indexdef(i.indexrelid) AS definition, i.indisunique
        FROM pg_index i
        WHERE i.indrelid = 'events'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = i.indexrelid)
        ORDER BY i.indexrelid
    """)).all()
    if any(i.indisunique for i in indexes):
        raise RuntimeError("events has a unique index outside a constraint; say here how "
                           "it keeps the partition key before partitioning it")
    columns = bind.execute(sa.text("""
        SELECT quote_ident(attname) FROM pg_attribute
        WHERE attrelid = 'events'::regclass AND attnum > 0 AND NOT attisdropped
          AND attgenerated = ''
        ORDER BY attnum
    """)).scalars().all()
    primary = next((c.conname, list(c.cols)) for c in constraints if c.contype == "p")
    return _Shape(
        primary=primary,
        uniques=[(c.conname, list(c.cols)) for c in constraints if c.contype == "u"],
        # A partitioned parent's index reads "ON ONLY public.events": recreated on a
        # plain table (or as a parent index that cascades to partitions) without ONLY.
        indexes=[i.definition.replace(" ON ONLY ", " ON ") for i in indexes],
        foreign_keys=[(c.conname, c.definition) for c in constraints if c.contype == "f"],
        columns=list(columns),
    )


def _replace(bind: Connection, new: str) -> None:
    """Drop the old ``events`` and give its name to ``new``, keeping the sequences."""
    sequences = bind.execute(sa.text("""
        SELECT quote_ident(attname) AS col, pg_get_serial_sequence('events', attname) AS seq
        FROM pg_attribute
        WHERE attrelid = 'events'::regclass AND attnum > 0 AND NOT attisdropped
    """)).all()
    owned = [(s.col, s.seq) for s in sequences if s.seq is not None]
    # The new table's defaults use the old table's sequences: release them from the old
    # table so dropping it does not drop them, then hand them to the new one.
    for _, seq in owned:
        _run(f"ALTER SEQUENCE {seq} OWNED BY NONE")
    _run("DROP TABLE events")
    _run(f"ALTER TABLE {new} RENAME TO events")
    for col, seq in owned:
        _run(f"ALTER SEQUENCE {seq} OWNED BY events.{col}")


def _finish(shape: _Shape, views: list[View]) -> None:
    for definition in shape.indexes:
        _run(definition)
    for name, definition in shape.foreign_keys:
        _run(f"ALTER TABLE events ADD CONSTRAINT {name} {definition}")
    create_views(op.get_bind(), views)
    _run("ANALYZE events")
