"""Drain reports: each drain with its children, durations and failures by reason.

- ``report_drain_children``: one row per child migration a drain started — the pod, the
  target, how it ended (the child's phase, or ``Refused`` when its submission was
  refused), why, and when it started and settled as the drain observed it.
- ``report_drains``: one row per drain — node, outcome, children started / succeeded /
  failed, duration.
- ``report_drain_failures``: per drain, the children that did not succeed, counted by
  reason.

Views over ``events`` and ``machines`` only (no dependency on 0004's columns), so they are
as fresh as the log; the same figures on SQLite and PostgreSQL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _dialect() -> tuple[str, str]:
    """(json text field template, seconds-between template)."""
    if op.get_bind().dialect.name == "postgresql":
        return "({col}->>'{key}')", "EXTRACT(EPOCH FROM ({end} - {start}))"
    return ("json_extract({col}, '$.{key}')",
            "((julianday({end}) - julianday({start})) * 86400.0)")


def upgrade() -> None:
    field, seconds = _dialect()

    def f(col: str, key: str) -> str:
        return field.format(col=col, key=key)

    op.execute(f"""
CREATE VIEW report_drain_children AS
SELECT s.machine_id AS drain_id, {f("s.data", "child")} AS child_id,
       {f("s.data", "pod")} AS pod, {f("s.data", "target")} AS target,
       CASE WHEN r.position IS NOT NULL THEN 'Refused'
            WHEN e.position IS NOT NULL THEN {f("e.data", "phase")}
            ELSE NULL END AS outcome,
       CASE WHEN r.position IS NOT NULL THEN {f("r.data", "error_class")}
            ELSE NULLIF({f("e.data", "reason")}, '') END AS reason,
       s.recorded_at AS started_at, COALESCE(e.recorded_at, r.recorded_at) AS finished_at,
       {seconds.format(end="COALESCE(e.recorded_at, r.recorded_at)", start="s.recorded_at")}
           AS duration_seconds
FROM events s
LEFT JOIN events e ON e.machine_id = s.machine_id AND e.type = 'ChildFinished'
 AND {f("e.data", "child")} = {f("s.data", "child")}
LEFT JOIN events r ON r.machine_id = s.machine_id AND r.type = 'ActionFailed'
 AND {f("r.data", "action")} = 'SubmitOperation'
 AND {f("r.data", "key")} = s.machine_id || ':submit:' || {f("s.data", "child")}
WHERE s.type = 'ChildStarted'
""")
    op.execute(f"""
CREATE VIEW report_drains AS
SELECT m.id AS drain_id, {f("m.spec", "node")} AS node, m.phase AS outcome, m.terminal,
       m.created_at AS submitted_at, d.recorded_at AS finished_at,
       {seconds.format(end="d.recorded_at", start="m.created_at")} AS duration_seconds,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = m.id) AS children,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = m.id
         AND c.outcome = 'Succeeded') AS succeeded,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = m.id
         AND c.outcome IS NOT NULL AND c.outcome <> 'Succeeded') AS failed,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = m.id
         AND c.outcome IS NULL) AS in_flight
FROM machines m
LEFT JOIN events d ON d.machine_id = m.id AND d.type = 'DrainFinished'
WHERE m.kind = 'drain'
""")
    op.execute("""
CREATE VIEW report_drain_failures AS
SELECT drain_id, COALESCE(reason, outcome) AS reason, count(*) AS children
FROM report_drain_children
WHERE outcome IS NOT NULL AND outcome <> 'Succeeded'
GROUP BY drain_id, COALESCE(reason, outcome)
""")


def downgrade() -> None:
    op.execute("DROP VIEW report_drain_failures")
    op.execute("DROP VIEW report_drains")
    op.execute("DROP VIEW report_drain_children")
