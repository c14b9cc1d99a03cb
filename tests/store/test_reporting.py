"""The reporting views and every query in docs/reporting.md, on SQLite and PostgreSQL,
over a history the real product wrote (the demo's checkpoint, migration, suspend and
resume through the simulator, the agents and the on-disk registry)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from controlplane.cli.demo import Demo
from controlplane.cli.embedded import embedded
from controlplane.clock import SystemClock
from controlplane.store import reports
from controlplane.store.database import Database

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
