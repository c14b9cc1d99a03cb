"""The reporting views and every query in docs/reporting.md, on SQLite and PostgreSQL,
over a history the real product wrote (the demo's checkpoint, migration, suspend and
resume through the simulator, the agents and the on-disk registry)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.cli.demo import Demo
from controlplane.clock import SystemClock
from controlplane.store import reports
from controlplane.store.database import Database
from controlplane.store.session import write_txn
from controlplane.wiring.embedded import embedded

DOC = Path(__file__).resolve().parents[2] / "docs" / "reporting.md"


@pytest.fixture
async def history(db: Database, tmp_path: Path) -> Database:
    async with embedded(db, tmp_path, SystemClock()) as world:
        await Demo(db, world, time.monotonic()).run()
    return db


def doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


async def test_every_query_in_the_reporting_doc_runs(history: Database) -> None:
    queries = doc_queries()
    assert len(queries) >= 6
    for sql in queries:
        await reports.rows(history, sql)  # raises on any SQL the backend rejects


async def test_operations_view_reports_each_operation_with_its_outcome(
    history: Database,
) -> None:
    rows = await reports.rows(history, "SELECT kind, workload, source_node, outcome, "
                              "finish_reason, duration_seconds, events FROM report_operations")
    by_kind = {r["kind"]: r for r in rows}
    assert {k: by_kind[k]["outcome"] for k in by_kind} == {
        "checkpoint": "Succeeded", "migration": "Succeeded", "suspend": "Suspended",
        "resume": "Resumed"}
    assert by_kind["migration"]["workload"] == "default/app"
    assert by_kind["migration"]["source_node"] == "node-1"
    assert by_kind["migration"]["finish_reason"] == "Migrated"
    assert all(float(r["duration_seconds"]) > 0 for r in rows)
    assert all(r["events"] >= 5 for r in rows)


async def test_checkpoints_view_has_one_verified_artifact_per_capture(
    history: Database,
) -> None:
    rows = await reports.rows(history, "SELECT kind, digest, capture_seconds, checkpoint_id "
                              "FROM report_checkpoints ORDER BY kind")
    assert [r["kind"] for r in rows] == ["checkpoint", "migration", "suspend"]
    assert all(str(r["digest"]).startswith("sha256:") for r in rows)
    assert all(float(r["capture_seconds"]) >= 0 and r["checkpoint_id"] for r in rows)


async def test_daily_view_and_summaries_count_successes(history: Database) -> None:
    daily = await reports.rows(history, "SELECT kind, operations, succeeded, failed, running "
                               "FROM report_daily ORDER BY kind")
    assert [(r["kind"], r["operations"], r["succeeded"], r["failed"]) for r in daily] == [
        ("checkpoint", 1, 1, 0), ("migration", 1, 1, 0), ("resume", 1, 1, 0),
        ("suspend", 1, 1, 0)]
    by_node = await reports.summary(history, report="operations", by="node")
    assert {r["node"]: r["count"] for r in by_node} == {"-": 1, "node-1": 2, "node-3": 1}
    assert all(r["success_rate"] == 1.0 for r in by_node)
    by_kind = await reports.summary(history, report="checkpoints", by="kind")
    assert [r["kind"] for r in by_kind] == ["checkpoint", "migration", "suspend"]
    assert all(r["p95_seconds"] is not None for r in by_kind)


async def test_checkpoints_view_reports_class_and_the_archive_size_the_manifest_declares(
    history: Database,
) -> None:
    rows = await reports.rows(history, "SELECT kind, class_name, size_bytes "
                              "FROM report_checkpoints ORDER BY kind")
    assert [r["class_name"] for r in rows] == ["default", "default", "default"]
    assert all(int(r["size_bytes"]) > 0 for r in rows)


async def test_migrations_view_splits_the_duration_into_phases_that_add_up(
    history: Database,
) -> None:
    rows = await reports.rows(history, "SELECT * FROM report_migrations")
    assert len(rows) == 1
    m = rows[0]
    assert (m["workload"], m["source_node"], m["target_node"], m["final_node"]) == (
        "default/app", "node-1", "node-2", "node-2")
    assert (m["outcome"], m["finish_reason"], m["class_name"]) == (
        "Succeeded", "Migrated", "default")
    assert (int(m["restore_attempts"]), int(m["retargets"])) == (1, 0)
    assert int(m["size_bytes"]) > 0
    phases = [float(m[p]) for p in reports.MIGRATION_PHASES]
    assert all(p >= 0 for p in phases)
    assert sum(phases) == pytest.approx(float(m["duration_seconds"]), abs=1e-3)
    ordered = [str(m[c]) for c in ("submitted_at", "capture_requested_at",
                                   "artifact_verified_at", "source_deleted_at",
                                   "restore_verified_at", "finished_at")]
    assert ordered == sorted(ordered)


async def test_migration_and_class_summaries_report_phase_medians_and_bytes(
    history: Database,
) -> None:
    [by_class] = await reports.summary(history, report="migrations", by="class")
    assert (by_class["class"], by_class["count"], by_class["succeeded"]) == ("default", 1, 1)
    assert by_class["bytes"] > 0
    assert all(by_class[f"p50_{p}"] is not None for p in reports.MIGRATION_PHASES)
    by_node = await reports.summary(history, report="checkpoints", by="class")
    assert [(r["class"], r["count"]) for r in by_node] == [("default", 3)]


async def test_a_restore_verified_before_its_source_went_has_no_restore_phase(
    history: Database,
) -> None:
    """A streamed migration verifies its restore before it deletes the source: its
    ``restore_seconds`` is NULL (not negative), and the phases around it stand."""
    [m] = await reports.rows(history, "SELECT * FROM report_migrations")
    async with write_txn(history) as conn:  # the restore verified with the artifact
        await conn.execute(text("""
            UPDATE events SET recorded_at = (
                SELECT recorded_at FROM events s
                WHERE s.machine_id = events.machine_id AND s.type = 'ArtifactVerified')
            WHERE type = 'RestoreVerified' AND machine_id = :id"""),
                           {"id": m["operation_id"]})
    [streamed] = await reports.rows(history, "SELECT * FROM report_migrations")
    assert float(m["restore_seconds"]) >= 0
    assert streamed["restore_seconds"] is None
    for phase in ("queued_seconds", "checkpoint_seconds", "delete_seconds"):
        assert streamed[phase] == m[phase], phase
