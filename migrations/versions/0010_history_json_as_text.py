"""Event data and facts, and the machines' spec, as ``json`` (text), not ``jsonb``.

History rows are written once and read whole (a replay, ``cpctl history``) or through
``->``/``->>`` in the reporting views. ``jsonb``'s binary form buys containment, equality
and GIN indexes, none of which any reader of these columns uses, and costs twice:

- bytes: a key and a value cost a 4-byte entry each, so a migration's event data took 317
  bytes a row as ``jsonb`` against ~275 as compact text (``bench.scale``, 12 events a
  migration: ~0.5 KiB of the ~12 KiB a migration keeps);
- the replay's read: PostgreSQL turns ``jsonb`` back into text for every row it sends,
  6.0 us per event against 2.6 as ``json`` (``bench.replay_storage``, recorded in
  docs/performance.md as a lever left open until now).

The views reading these columns are captured, dropped and recreated around the change
(``migrations/dependent_views.py``). PostgreSQL only; SQLite's JSON is text already.
Rows written before keep their content; converted, they hold PostgreSQL's ``jsonb`` text
(a space after each ``:`` and ``,``), new rows the compact text the store writes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

from migrations.dependent_views import create_views, dependent_views, drop_views, run

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = (("events", "data"), ("events", "facts"), ("machines", "spec"))


def _retype(to: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    views = dependent_views(bind, sorted({table for table, _ in COLUMNS}))
    drop_views(bind, views)
    for table in sorted({table for table, _ in COLUMNS}):
        changes = ", ".join(f"ALTER COLUMN {column} TYPE {to} USING {column}::{to}"
                            for t, column in COLUMNS if t == table)
        run(bind, f"ALTER TABLE {table} {changes}")
    create_views(bind, views)


def upgrade() -> None:
    _retype("json")


def downgrade() -> None:
    _retype("jsonb")
