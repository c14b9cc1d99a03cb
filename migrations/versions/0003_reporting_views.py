"""Reporting views over the event log: operations, checkpoints, daily outcomes.

Plain SQL for operators (``docs/reporting.md``). They read the events and the machines
projection only, so they are always as fresh as the log and cost nothing to keep.
JSON access and time arithmetic differ per backend; the columns do not.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SUCCESS = "('Succeeded', 'Suspended', 'Resumed')"


def _dialect() -> tuple[str, str, str]:
    """(json text field template, seconds-between template, day template)."""
    if op.get_bind().dialect.name == "postgresql":
        return ("({col}->>'{key}')", "EXTRACT(EPOCH FROM ({end} - {start}))",
                "CAST(date_trunc('day', {ts}) AS date)")
    return ("json_extract({col}, '$.{key}')",
            "((julianday({end}) - julianday({start})) * 86400.0)", "date({ts})")


def upgrade() -> None:
    field, seconds, day = _dialect()
    op.execute(f"""
CREATE VIEW report_operations AS
SELECT m.id AS operation_id, m.kind, m.workload, m.source_node, m.phase AS outcome,
       m.terminal, m.created_at AS submitted_at, f.recorded_at AS finished_at,
       {seconds.format(end="f.recorded_at", start="m.created_at")} AS duration_seconds,
       {field.format(col="f.data", key="reason")} AS finish_reason,
       {field.format(col="f.data", key="message")} AS finish_message,
       (SELECT count(*) FROM events c WHERE c.machine_id = m.id) AS events
FROM machines m
LEFT JOIN events f ON f.machine_id = m.id AND f.type LIKE '%Finished'
""")
    op.execute(f"""
CREATE VIEW report_checkpoints AS
SELECT v.machine_id AS operation_id, m.kind, m.workload, m.source_node,
       {field.format(col="r.data", key="checkpoint_id")} AS checkpoint_id,
       {field.format(col="v.data", key="digest")} AS digest,
       {field.format(col="v.data", key="artifact")} AS artifact,
       r.recorded_at AS requested_at, v.recorded_at AS verified_at,
       {seconds.format(end="v.recorded_at", start="r.recorded_at")} AS capture_seconds,
       m.phase AS operation_outcome
FROM events v
JOIN machines m ON m.id = v.machine_id
JOIN events r ON r.machine_id = v.machine_id AND r.type = 'CaptureRequested'
 AND r.seq = (SELECT max(p.seq) FROM events p WHERE p.machine_id = v.machine_id
              AND p.type = 'CaptureRequested' AND p.seq < v.seq)
WHERE v.type = 'ArtifactVerified'
""")
    op.execute(f"""
CREATE VIEW report_daily AS
SELECT {day.format(ts="submitted_at")} AS day, kind,
       count(*) AS operations,
       sum(CASE WHEN outcome IN {SUCCESS} THEN 1 ELSE 0 END) AS succeeded,
       sum(CASE WHEN terminal AND outcome NOT IN {SUCCESS} THEN 1 ELSE 0 END) AS failed,
       sum(CASE WHEN terminal THEN 0 ELSE 1 END) AS running,
       avg(duration_seconds) AS mean_duration_seconds
FROM report_operations
GROUP BY {day.format(ts="submitted_at")}, kind
""")


def downgrade() -> None:
    op.execute("DROP VIEW report_daily")
    op.execute("DROP VIEW report_checkpoints")
    op.execute("DROP VIEW report_operations")
