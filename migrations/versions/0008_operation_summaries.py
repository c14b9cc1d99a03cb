"""Operation summaries kept after pruning (retention, issue 26).

- ``operation_summaries`` (new): one row per pruned operation (``store/retention.py``
  writes it before it deletes the operation's events, decisions and machines row): kind,
  workload, nodes, outcome, reason, times, requester, event count, bytes, and in
  ``milestones`` the rows the reporting views had for it (its migration phases, its
  checkpoints, its drain and the drain's children).
- Every reporting view is redefined as the live rows UNION ALL the summaries' rows. A
  machine that has a summary is counted from the summary alone, also while its events
  and machines row still exist (a prune between its phases), so a report over all time
  adds up the same before, during and after a prune. Durations are computed from the
  same times with the same expressions on both sides, so they are equal to the last bit.

JSON access and time arithmetic differ per backend (see 0004's ``_Sql``); the columns do
not. ``report_daily`` and ``report_drain_failures`` read other views and are recreated
unchanged. The downgrade recreates the views as 0004-0006 left them, then drops the table
(its rows, and so the pruned operations' figures, are lost: say so before running it).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SUCCESS = "('Succeeded', 'Suspended', 'Resumed')"
VIEWS = ("report_operations", "report_checkpoints", "report_daily", "report_migrations",
         "report_drain_children", "report_drains", "report_drain_failures")
SUMMARIZED = "EXISTS (SELECT 1 FROM operation_summaries z WHERE z.machine_id = {id})"


class _Sql:
    """The per-backend spellings of JSON access, time arithmetic and days."""

    def __init__(self, postgresql: bool) -> None:
        self.postgresql = postgresql
        self.true = "TRUE" if postgresql else "1"

    def text(self, col: str, *path: str) -> str:
        if self.postgresql:
            return "(" + col + "".join(f"->'{p}'" for p in path[:-1]) + f"->>'{path[-1]}')"
        return f"json_extract({col}, '$.{'.'.join(path)}')"

    def number(self, col: str, *path: str) -> str:
        return f"CAST({self.text(col, *path)} AS BIGINT)"

    def time(self, col: str, *path: str) -> str:
        """A time the summary kept as the view returned it (SQLite: its UTC text)."""
        value = self.text(col, *path)
        return f"CAST({value} AS timestamptz)" if self.postgresql else value

    def type_is(self, alias: str) -> str:
        """``alias.type`` where the rows are also matched by ``alias.machine_id``: on SQLite
        with a unary ``+``, so the planner looks the row up by machine (the unique
        ``machine_id, seq`` index) instead of scanning every event of that type for each
        row (``ix_events_type``), which made a report quadratic in the operations."""
        return f"{alias}.type" if self.postgresql else f"+{alias}.type"

    def seconds(self, end: str, start: str) -> str:
        if self.postgresql:
            return f"EXTRACT(EPOCH FROM ({end} - {start}))"
        return f"((julianday({end}) - julianday({start})) * 86400.0)"

    def day(self, ts: str) -> str:
        return f"CAST(date_trunc('day', {ts}) AS date)" if self.postgresql else f"date({ts})"

    def elements(self, col: str, key: str, alias: str) -> str:
        """A join over the JSON array ``col.key``, its elements as ``alias.value``."""
        if self.postgresql:
            return f"CROSS JOIN LATERAL jsonb_array_elements({col}->'{key}') AS {alias}(value)"
        return f"JOIN json_each({col}, '$.{key}') AS {alias}"


def _live(summaries: bool, machine_id: str) -> str:
    return f"NOT {SUMMARIZED.format(id=machine_id)}" if summaries else "1 = 1"


def _operations(sql: _Sql, summaries: bool) -> str:
    live = f"""
SELECT m.id AS operation_id, m.kind, m.workload, m.source_node, m.phase AS outcome,
       m.terminal, m.created_at AS submitted_at, f.recorded_at AS finished_at,
       {sql.seconds("f.recorded_at", "m.created_at")} AS duration_seconds,
       {sql.text("f.data", "reason")} AS finish_reason,
       {sql.text("f.data", "message")} AS finish_message,
       (SELECT count(*) FROM events c WHERE c.machine_id = m.id) AS events,
       COALESCE({sql.text("m.spec", "class", "name")}, 'default') AS class_name
FROM machines m
LEFT JOIN events f ON f.machine_id = m.id
 AND f.type LIKE '%Finished' AND f.type <> 'ChildFinished'"""
    if not summaries:
        return "CREATE VIEW report_operations AS" + live + "\n"
    return f"""CREATE VIEW report_operations AS{live}
WHERE {_live(summaries, "m.id")}
UNION ALL
SELECT s.machine_id, s.kind, s.workload, s.source_node, s.outcome, {sql.true},
       s.submitted_at, s.finished_at, {sql.seconds("s.finished_at", "s.submitted_at")},
       s.reason, s.message, s.events, s.class_name
FROM operation_summaries s
"""


def _checkpoints(sql: _Sql, summaries: bool) -> str:
    live = f"""
SELECT v.machine_id AS operation_id, m.kind, m.workload, m.source_node,
       {sql.text("r.data", "checkpoint_id")} AS checkpoint_id,
       {sql.text("v.data", "digest")} AS digest,
       {sql.text("v.data", "artifact")} AS artifact,
       r.recorded_at AS requested_at, v.recorded_at AS verified_at,
       {sql.seconds("v.recorded_at", "r.recorded_at")} AS capture_seconds,
       m.phase AS operation_outcome,
       COALESCE({sql.text("m.spec", "class", "name")}, 'default') AS class_name,
       {sql.number("v.data", "size_bytes")} AS size_bytes
FROM events v
JOIN machines m ON m.id = v.machine_id
JOIN events r ON r.machine_id = v.machine_id AND r.type = 'CaptureRequested'
 AND r.seq = (SELECT max(p.seq) FROM events p WHERE p.machine_id = v.machine_id
              AND p.type = 'CaptureRequested' AND p.seq < v.seq)
WHERE {sql.type_is("v")} = 'ArtifactVerified'"""
    if not summaries:
        return "CREATE VIEW report_checkpoints AS" + live + "\n"
    requested, verified = sql.time("c.value", "requested_at"), sql.time("c.value", "verified_at")
    return f"""CREATE VIEW report_checkpoints AS{live} AND {_live(summaries, "v.machine_id")}
UNION ALL
SELECT s.machine_id, s.kind, s.workload, s.source_node,
       {sql.text("c.value", "checkpoint_id")}, {sql.text("c.value", "digest")},
       {sql.text("c.value", "artifact")}, {requested}, {verified},
       {sql.seconds(verified, requested)}, s.outcome, s.class_name,
       {sql.number("c.value", "size_bytes")}
FROM operation_summaries s
{sql.elements("s.milestones", "checkpoints", "c")}
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


def _migrations(sql: _Sql, summaries: bool) -> str:
    def first(types: str) -> str:
        return f"min(CASE WHEN e.type IN ({types}) THEN e.recorded_at END)"

    def last(types: str) -> str:
        return f"max(CASE WHEN e.type IN ({types}) THEN e.recorded_at END)"

    def count(types: str) -> str:
        return f"sum(CASE WHEN e.type IN ({types}) THEN 1 ELSE 0 END)"

    live = f"""
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
LEFT JOIN events f ON f.machine_id = m.id AND {sql.type_is("f")} = 'MigrationFinished'
WHERE m.kind = 'migration'"""
    if not summaries:
        return "CREATE VIEW report_migrations AS" + live + "\n"

    def at(key: str) -> str:
        return sql.time("s.milestones", "migration", key)

    captured, verified = at("capture_requested_at"), at("artifact_verified_at")
    deleted, restored = at("source_deleted_at"), at("restore_verified_at")
    return f"""CREATE VIEW report_migrations AS{live} AND {_live(summaries, "m.id")}
UNION ALL
SELECT s.machine_id, s.workload, s.source_node, s.target_node, s.final_node, s.class_name,
       s.outcome, {sql.true}, s.reason, s.submitted_at, {captured}, {verified}, {deleted},
       {restored}, s.finished_at,
       {sql.seconds(captured, "s.submitted_at")}, {sql.seconds(verified, captured)},
       {sql.seconds(deleted, verified)}, {sql.seconds(restored, deleted)},
       {sql.seconds("s.finished_at", restored)}, {sql.seconds("s.finished_at", "s.submitted_at")},
       s.bytes, {sql.number("s.milestones", "migration", "restore_attempts")},
       {sql.number("s.milestones", "migration", "retargets")}
FROM operation_summaries s
WHERE s.kind = 'migration' AND {sql.text("s.milestones", "migration", "outcome")} IS NOT NULL
"""


def _drain_children(sql: _Sql, summaries: bool) -> str:
    def f(col: str, key: str) -> str:
        return sql.text(col, key)

    live = f"""
SELECT s.machine_id AS drain_id, {f("s.data", "child")} AS child_id,
       {f("s.data", "pod")} AS pod, {f("s.data", "target")} AS target,
       CASE WHEN r.position IS NOT NULL THEN 'Refused'
            WHEN e.position IS NOT NULL THEN {f("e.data", "phase")}
            ELSE NULL END AS outcome,
       CASE WHEN r.position IS NOT NULL THEN {f("r.data", "error_class")}
            ELSE NULLIF({f("e.data", "reason")}, '') END AS reason,
       s.recorded_at AS started_at, COALESCE(e.recorded_at, r.recorded_at) AS finished_at,
       {sql.seconds("COALESCE(e.recorded_at, r.recorded_at)", "s.recorded_at")}
           AS duration_seconds
FROM events s
LEFT JOIN events e ON e.machine_id = s.machine_id AND {sql.type_is("e")} = 'ChildFinished'
 AND {f("e.data", "child")} = {f("s.data", "child")}
LEFT JOIN events r ON r.machine_id = s.machine_id AND {sql.type_is("r")} = 'ActionFailed'
 AND {f("r.data", "action")} = 'SubmitOperation'
 AND {f("r.data", "key")} = s.machine_id || ':submit:' || {f("s.data", "child")}
WHERE {sql.type_is("s")} = 'ChildStarted'"""
    if not summaries:
        return "CREATE VIEW report_drain_children AS" + live + "\n"
    started, finished = sql.time("c.value", "started_at"), sql.time("c.value", "finished_at")
    return f"""CREATE VIEW report_drain_children AS{live} AND {_live(summaries, "s.machine_id")}
UNION ALL
SELECT s.machine_id, {f("c.value", "child_id")}, {f("c.value", "pod")},
       {f("c.value", "target")}, {f("c.value", "outcome")}, {f("c.value", "reason")},
       {started}, {finished}, {sql.seconds(finished, started)}
FROM operation_summaries s
{sql.elements("s.milestones", "drain_children", "c")}
WHERE s.kind = 'drain'
"""


def _counts(drain_id: str) -> str:
    return f"""(SELECT count(*) FROM report_drain_children c WHERE c.drain_id = {drain_id})
           AS children,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = {drain_id}
         AND c.outcome = 'Succeeded') AS succeeded,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = {drain_id}
         AND c.outcome IS NOT NULL AND c.outcome <> 'Succeeded') AS failed,
       (SELECT count(*) FROM report_drain_children c WHERE c.drain_id = {drain_id}
         AND c.outcome IS NULL) AS in_flight"""


def _drains(sql: _Sql, summaries: bool) -> str:
    live = f"""
SELECT m.id AS drain_id, {sql.text("m.spec", "node")} AS node, m.phase AS outcome, m.terminal,
       m.created_at AS submitted_at, d.recorded_at AS finished_at,
       {sql.seconds("d.recorded_at", "m.created_at")} AS duration_seconds,
       {_counts("m.id")}
FROM machines m
LEFT JOIN events d ON d.machine_id = m.id AND {sql.type_is("d")} = 'DrainFinished'
WHERE m.kind = 'drain'"""
    if not summaries:
        return "CREATE VIEW report_drains AS" + live + "\n"
    finished = sql.time("s.milestones", "drain", "finished_at")
    return f"""CREATE VIEW report_drains AS{live} AND {_live(summaries, "m.id")}
UNION ALL
SELECT s.machine_id, {sql.text("s.milestones", "drain", "node")}, s.outcome, {sql.true},
       s.submitted_at, {finished}, {sql.seconds(finished, "s.submitted_at")},
       {_counts("s.machine_id")}
FROM operation_summaries s
WHERE s.kind = 'drain' AND {sql.text("s.milestones", "drain", "outcome")} IS NOT NULL
"""


def _drain_failures() -> str:
    return """
CREATE VIEW report_drain_failures AS
SELECT drain_id, COALESCE(reason, outcome) AS reason, count(*) AS children
FROM report_drain_children
WHERE outcome IS NOT NULL AND outcome <> 'Succeeded'
GROUP BY drain_id, COALESCE(reason, outcome)
"""


def _replace_views(summaries: bool) -> None:
    sql = _Sql(op.get_bind().dialect.name == "postgresql")
    for view in reversed(VIEWS):
        op.execute(f"DROP VIEW {view}")
    op.execute(_operations(sql, summaries))
    op.execute(_checkpoints(sql, summaries))
    op.execute(_daily(sql))
    op.execute(_migrations(sql, summaries))
    op.execute(_drain_children(sql, summaries))
    op.execute(_drains(sql, summaries))
    op.execute(_drain_failures())


def upgrade() -> None:
    op.create_table(
        "operation_summaries",
        sa.Column("machine_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("workload", sa.String(320), nullable=True),
        sa.Column("source_node", sa.String(253), nullable=True),
        sa.Column("target_node", sa.String(253), nullable=True),
        sa.Column("final_node", sa.String(253), nullable=True),
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(1024), nullable=True),
        sa.Column("message", sa.String(4096), nullable=True),
        sa.Column("class_name", sa.String(253), nullable=False),
        sa.Column("requester", sa.String(320), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("milestones", sa.JSON().with_variant(JSONB(), "postgresql"),
                  nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_operation_summaries_submitted", "operation_summaries",
                    ["submitted_at"])
    _replace_views(summaries=True)


def downgrade() -> None:
    _replace_views(summaries=False)
    op.drop_index("ix_operation_summaries_submitted", table_name="operation_summaries")
    op.drop_table("operation_summaries")
