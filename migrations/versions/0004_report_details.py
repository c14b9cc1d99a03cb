"""Reporting detail: checkpoint class and size, and migrations phase by phase.

- ``report_operations`` gains ``class_name`` (the checkpoint class the spec embedded).
- ``report_checkpoints`` gains ``class_name`` and ``size_bytes`` (the archives' size the
  verified manifest declares; NULL for artifacts verified before this revision).
- ``report_migrations`` (new): one row per migration with the time of each milestone and
  the seconds spent between them (queued, checkpoint, delete source, restore, garbage
  collection), the target asked for and the node it ended on.

Views only: nothing is copied, so they are as fresh as the log. ``report_daily`` is
recreated unchanged because it reads ``report_operations``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SUCCESS = "('Succeeded', 'Suspended', 'Resumed')"


class _Sql:
    """The per-backend spellings of JSON access, time arithmetic and days."""

    def __init__(self, postgresql: bool) -> None:
        self.postgresql = postgresql

    def text(self, col: str, *path: str) -> str:
        if self.postgresql:
            return "(" + col + "".join(f"->'{p}'" for p in path[:-1]) + f"->>'{path[-1]}')"
        return f"json_extract({col}, '$.{'.'.join(path)}')"

    def number(self, col: str, *path: str) -> str:
        return f"CAST({self.text(col, *path)} AS BIGINT)"

    def seconds(self, end: str, start: str) -> str:
        if self.postgresql:
            return f"EXTRACT(EPOCH FROM ({end} - {start}))"
        return f"((julianday({end}) - julianday({start})) * 86400.0)"

    def day(self, ts: str) -> str:
        return f"CAST(date_trunc('day', {ts}) AS date)" if self.postgresql else f"date({ts})"


def _operations(sql: _Sql) -> str:
    return f"""
CREATE VIEW report_operations AS
SELECT m.id AS operation_id, m.kind, m.workload, m.source_node, m.phase AS outcome,
       m.terminal, m.created_at AS submitted_at, f.recorded_at AS finished_at,
       {sql.seconds("f.recorded_at", "m.created_at")} AS duration_seconds,
       {sql.text("f.data", "reason")} AS finish_reason,
       {sql.text("f.data", "message")} AS finish_message,
       (SELECT count(*) FROM events c WHERE c.machine_id = m.id) AS events,
       COALESCE({sql.text("m.spec", "class", "name")}, 'default') AS class_name
FROM machines m
LEFT JOIN events f ON f.machine_id = m.id AND f.type LIKE '%Finished'
"""


def _checkpoints(sql: _Sql, *, detail: bool) -> str:
    extra = (f""",
       COALESCE({sql.text("m.spec", "class", "name")}, 'default') AS class_name,
       {sql.number("v.data", "size_bytes")} AS size_bytes""" if detail else "")
    return f"""
CREATE VIEW report_checkpoints AS
SELECT v.machine_id AS operation_id, m.kind, m.workload, m.source_node,
       {sql.text("r.data", "checkpoint_id")} AS checkpoint_id,
       {sql.text("v.data", "digest")} AS digest,
       {sql.text("v.data", "artifact")} AS artifact,
       r.recorded_at AS requested_at, v.recorded_at AS verified_at,
       {sql.seconds("v.recorded_at", "r.recorded_at")} AS capture_seconds,
       m.phase AS operation_outcome{extra}
FROM events v
JOIN machines m ON m.id = v.machine_id
JOIN events r ON r.machine_id = v.machine_id AND r.type = 'CaptureRequested'
 AND r.seq = (SELECT max(p.seq) FROM events p WHERE p.machine_id = v.machine_id
              AND p.type = 'CaptureRequested' AND p.seq < v.seq)
WHERE v.type = 'ArtifactVerified'
"""


def _daily(sql: _Sql) -> str:
    return f"""
CREATE VIEW report_daily AS
SELECT {sql.day("submitted_at")} AS day, kind,
       count(*) AS operations,
       sum(CASE WHEN outcome IN {SUCCESS} THEN 1 ELSE 0 END) AS succeeded,
       sum(CASE WHEN terminal AND outcome NOT IN {SUCCESS} THEN 1 ELSE 0 END) AS failed,
       sum(CASE WHEN terminal THEN 0 ELSE 1 END) AS running,
       avg(duration_seconds) AS mean_duration_seconds
FROM report_operations
GROUP BY {sql.day("submitted_at")}, kind
"""


def _migrations(sql: _Sql) -> str:
    def first(types: str) -> str:
        return f"min(CASE WHEN e.type IN ({types}) THEN e.recorded_at END)"

    def last(types: str) -> str:
        return f"max(CASE WHEN e.type IN ({types}) THEN e.recorded_at END)"

    def count(types: str) -> str:
        return f"sum(CASE WHEN e.type IN ({types}) THEN 1 ELSE 0 END)"

    return f"""
CREATE VIEW report_migrations AS
SELECT m.id AS operation_id, m.workload, m.source_node,
       {sql.text("m.spec", "target_node")} AS target_node,
       {sql.text("f.data", "final_node")} AS final_node,
       COALESCE({sql.text("m.spec", "class", "name")}, 'default') AS class_name,
       m.phase AS outcome, m.terminal,
       {sql.text("f.data", "reason")} AS finish_reason,
       m.created_at AS submitted_at, t.capture_requested_at, t.artifact_verified_at,
       t.source_deleted_at, t.restore_verified_at, f.recorded_at AS finished_at,
       {sql.seconds("t.capture_requested_at", "m.created_at")} AS queued_seconds,
       {sql.seconds("t.artifact_verified_at", "t.capture_requested_at")}
           AS checkpoint_seconds,
       {sql.seconds("t.source_deleted_at", "t.artifact_verified_at")} AS delete_seconds,
       {sql.seconds("t.restore_verified_at", "t.source_deleted_at")} AS restore_seconds,
       {sql.seconds("f.recorded_at", "t.restore_verified_at")} AS gc_seconds,
       {sql.seconds("f.recorded_at", "m.created_at")} AS duration_seconds,
       t.size_bytes, t.restore_attempts, t.retargets
FROM machines m
JOIN (SELECT e.machine_id,
             {first("'CaptureRequested'")} AS capture_requested_at,
             {first("'ArtifactVerified'")} AS artifact_verified_at,
             {first("'SourceDeleted', 'SourceVanished'")} AS source_deleted_at,
             {last("'RestoreVerified'")} AS restore_verified_at,
             max(CASE WHEN e.type = 'ArtifactVerified'
                      THEN {sql.number("e.data", "size_bytes")} END) AS size_bytes,
             {count("'RestorePodRequested'")} AS restore_attempts,
             {count("'Retargeted'")} AS retargets
      FROM events e
      GROUP BY e.machine_id) t ON t.machine_id = m.id
LEFT JOIN events f ON f.machine_id = m.id AND f.type = 'MigrationFinished'
WHERE m.kind = 'migration'
"""


def upgrade() -> None:
    sql = _Sql(op.get_bind().dialect.name == "postgresql")
    op.execute("DROP VIEW report_daily")
    op.execute("DROP VIEW report_checkpoints")
    op.execute("DROP VIEW report_operations")
    op.execute(_operations(sql))
    op.execute(_checkpoints(sql, detail=True))
    op.execute(_daily(sql))
    op.execute(_migrations(sql))


def downgrade() -> None:
    sql = _Sql(op.get_bind().dialect.name == "postgresql")
    op.execute("DROP VIEW report_migrations")
    op.execute("DROP VIEW report_daily")
    op.execute("DROP VIEW report_checkpoints")
    op.execute("DROP VIEW report_operations")
    op.execute(_operations(sql).replace(
        f",\n       COALESCE({sql.text('m.spec', 'class', 'name')}, 'default') AS class_name",
        ""))
    op.execute(_checkpoints(sql, detail=False))
    op.execute(_daily(sql))
