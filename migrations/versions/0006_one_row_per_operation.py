"""``report_operations``: one row per operation, also for a drain.

The view joined an operation's finishing event as ``type LIKE '%Finished'``; a drain
records a ``ChildFinished`` for every child besides its own ``DrainFinished``, so a drain
of N pods was N + 1 rows: ``cpctl report operations`` counted it N + 1 times and timed
it by its children's ends. The join now leaves ``ChildFinished`` out. ``report_daily``
reads the view and is recreated unchanged.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SUCCESS = "('Succeeded', 'Suspended', 'Resumed')"


def _text(postgresql: bool, col: str, *path: str) -> str:
    if postgresql:
        return "(" + col + "".join(f"->'{p}'" for p in path[:-1]) + f"->>'{path[-1]}')"
    return f"json_extract({col}, '$.{'.'.join(path)}')"


def _operations(postgresql: bool, finishing: str) -> str:
    seconds = ("EXTRACT(EPOCH FROM (f.recorded_at - m.created_at))" if postgresql
               else "((julianday(f.recorded_at) - julianday(m.created_at)) * 86400.0)")
    return f"""
CREATE VIEW report_operations AS
SELECT m.id AS operation_id, m.kind, m.workload, m.source_node, m.phase AS outcome,
       m.terminal, m.created_at AS submitted_at, f.recorded_at AS finished_at,
       {seconds} AS duration_seconds,
       {_text(postgresql, "f.data", "reason")} AS finish_reason,
       {_text(postgresql, "f.data", "message")} AS finish_message,
       (SELECT count(*) FROM events c WHERE c.machine_id = m.id) AS events,
       COALESCE({_text(postgresql, "m.spec", "class", "name")}, 'default') AS class_name
FROM machines m
LEFT JOIN events f ON f.machine_id = m.id AND {finishing}
"""


def _daily(postgresql: bool) -> str:
    day = ("CAST(date_trunc('day', submitted_at) AS date)" if postgresql
           else "date(submitted_at)")
    return f"""
CREATE VIEW report_daily AS
SELECT {day} AS day, kind,
       count(*) AS operations,
       sum(CASE WHEN outcome IN {SUCCESS} THEN 1 ELSE 0 END) AS succeeded,
       sum(CASE WHEN terminal AND outcome NOT IN {SUCCESS} THEN 1 ELSE 0 END) AS failed,
       sum(CASE WHEN terminal THEN 0 ELSE 1 END) AS running,
       avg(duration_seconds) AS mean_duration_seconds
FROM report_operations
GROUP BY {day}, kind
"""


def _replace(finishing: str) -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.execute("DROP VIEW report_daily")
    op.execute("DROP VIEW report_operations")
    op.execute(_operations(postgresql, finishing))
    op.execute(_daily(postgresql))


def upgrade() -> None:
    _replace("f.type LIKE '%Finished' AND f.type <> 'ChildFinished'")


def downgrade() -> None:
    _replace("f.type LIKE '%Finished'")
