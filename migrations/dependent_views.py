"""The views that read a table, captured so a migration can change the table under them.

PostgreSQL refuses to change a column's type (or to replace a table) while a view reads
it. A migration that must do so captures every view depending on the tables, directly
or through other views (``pg_get_viewdef``, with its comment), drops them children
first, changes the tables, and recreates them parents first from the captured text, so
it never has to know which ``report_*`` views exist at that revision. PostgreSQL only:
SQLite's views name their tables and are re-read at use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection


class View(NamedTuple):
    name: str  # schema-qualified and quoted
    materialized: bool
    definition: str
    comment: str | None  # quoted as a literal


def dependent_views(bind: Connection, tables: Sequence[str]) -> list[View]:
    """Every view reading one of ``tables``, directly or through other views, parents
    first."""
    rows = bind.execute(sa.text("""
        WITH RECURSIVE dep(oid, depth) AS (
            SELECT r.ev_class, 1
            FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
            WHERE d.classid = 'pg_rewrite'::regclass
              AND d.refobjid = ANY(CAST(:tables AS regclass[]))
              AND r.ev_class <> ALL(CAST(:tables AS regclass[]))
          UNION
            SELECT r.ev_class, dep.depth + 1
            FROM dep JOIN pg_depend d ON d.refobjid = dep.oid
            JOIN pg_rewrite r ON r.oid = d.objid
            WHERE d.classid = 'pg_rewrite'::regclass AND r.ev_class <> dep.oid
        )
        SELECT CAST(dep.oid AS regclass)::text AS name, c.relkind::text = 'm' AS materialized,
               pg_get_viewdef(dep.oid) AS definition,
               quote_literal(obj_description(dep.oid, 'pg_class')) AS comment
        FROM dep JOIN pg_class c ON c.oid = dep.oid
        GROUP BY dep.oid, c.relkind
        ORDER BY max(dep.depth), 1
    """), {"tables": list(tables)})
    return [View(r.name, r.materialized, r.definition, r.comment) for r in rows]


def run(bind: Connection, sql: str) -> None:
    # Straight to the driver: view definitions hold casts and literals (``::text``,
    # ``'a:b'``) that ``text()`` would read as bind parameters.
    bind.exec_driver_sql(sql)


def drop_views(bind: Connection, views: Sequence[View]) -> None:
    # No CASCADE: an object depending on these views that was not captured (a function,
    # a rule) stops the upgrade instead of vanishing.
    for view in reversed(views):
        run(bind, f"DROP {'MATERIALIZED VIEW' if view.materialized else 'VIEW'} {view.name}")


def create_views(bind: Connection, views: Sequence[View]) -> None:
    for view in views:
        kind = "MATERIALIZED VIEW" if view.materialized else "VIEW"
        run(bind, f"CREATE {kind} {view.name} AS {view.definition}")
        if view.comment is not None:
            run(bind, f"COMMENT ON {kind} {view.name} IS {view.comment}")
