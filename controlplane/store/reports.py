"""Read the reporting views (migrations 0003-0008) for ``cpctl report``, the summary page
and tests.

The views are plain SQL for operators (``docs/reporting.md``); this module only reads
them, and computes what SQLite cannot (percentiles) in Python, identically on both
backends. Since 0008 each view also holds the operations a prune replaced by a summary
row (``store/retention.py``), so every report here covers all time; only the figures
read from ``events`` directly (``event_counts``, the metrics') shrink with a prune.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, text

from controlplane.machines.catalog import success_phases
from controlplane.store.database import Database
from controlplane.store.session import read_txn

#: Phases that count as success, every kind's own (its ``view.py``).
SUCCESS = success_phases()
VIEWS = ("report_operations", "report_checkpoints", "report_daily", "report_migrations",
         "report_drains", "report_drain_children", "report_drain_failures")
#: ``cpctl report`` names: (view, the time column ``--since`` and ``--by day`` use,
#: the duration whose p50/p95 is reported).
REPORTS = {
    "operations": ("report_operations", "submitted_at", "duration_seconds"),
    "checkpoints": ("report_checkpoints", "verified_at", "capture_seconds"),
    "migrations": ("report_migrations", "submitted_at", "duration_seconds"),
}
#: The migration phases reported by their p50 (columns of ``report_migrations``).
MIGRATION_PHASES = ("queued_seconds", "checkpoint_seconds", "delete_seconds",
                    "restore_seconds", "gc_seconds")
GROUPINGS = ("kind", "node", "day", "class", "requester")
#: Every ``cpctl report`` name: the grouped summaries, and ``drains`` (one row per drain).
NAMES = (*REPORTS, "drains")


async def rows(db: Database, sql: str, params: dict[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """Run a read-only query; rows as dicts."""
    async with read_txn(db) as conn:
        result = await conn.execute(text(sql), params or {})
        return [dict(r._mapping) for r in result.all()]


async def finished_durations(db: Database) -> list[tuple[str, float]]:
    """(kind, submission-to-finish seconds) of every finished operation."""
    return [(str(r["kind"]), float(r["duration_seconds"])) for r in await rows(
        db, "SELECT kind, terminal, duration_seconds FROM report_operations")
        if r["terminal"] and r["duration_seconds"] is not None]


async def event_counts(db: Database, *, of_type: str) -> tuple[int, int]:
    """(every event, the events of type ``of_type``), in one scan."""
    [row] = await rows(db, "SELECT count(*) AS events, "
                           "sum(CASE WHEN type = :t THEN 1 ELSE 0 END) AS of_type FROM events",
                       {"t": of_type})
    return int(row["events"] or 0), int(row["of_type"] or 0)


async def migration_phases(db: Database, *, finished_only: bool = False
                           ) -> list[dict[str, Any]]:
    """Rows of ``report_migrations`` (each migration's phase durations)."""
    if finished_only:
        return await rows(db, "SELECT * FROM report_migrations WHERE terminal")
    return await rows(db, "SELECT * FROM report_migrations")


async def checkpoint_summaries(db: Database) -> list[dict[str, Any]]:
    """Every verified checkpoint as ``report_checkpoints`` shows it, oldest first."""
    return await rows(db, "SELECT kind, workload, source_node, class_name, size_bytes, "
                          "capture_seconds, operation_outcome FROM report_checkpoints "
                          "ORDER BY verified_at")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def report(db: Database, *, report: str, by: str,
                 since: datetime | None = None) -> list[dict[str, Any]]:
    """What ``cpctl report NAME`` and ``GET /api/v1/reports/NAME`` return."""
    if report == "drains":
        return await drains(db, since=since)
    return await summary(db, report=report, by=by, since=since)


def _since_param(db: Database, since: datetime) -> Any:
    # SQLite keeps UTC text in one fixed format (see schema.UtcDateTime): compare alike.
    return (since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            if db.backend == "sqlite" else since)


async def operations_since(db: Database, since: datetime) -> list[dict[str, Any]]:
    """``report_operations``' ``submitted_at``, ``outcome`` and ``terminal`` of those
    submitted at or after ``since`` (the summary page's hourly chart)."""
    return await rows(db, "SELECT submitted_at, outcome, terminal FROM report_operations "
                          "WHERE submitted_at >= :since", {"since": _since_param(db, since)})


async def failures_by_reason(db: Database) -> list[dict[str, Any]]:
    """Ended operations that did not succeed, counted by ``reason`` (their finish
    reason) and ``kind`` (``operations``): the summary page's failures chart."""
    stmt = text("SELECT finish_reason AS reason, kind, count(*) AS operations "
                "FROM report_operations WHERE terminal AND outcome NOT IN :succeeded "
                "GROUP BY finish_reason, kind").bindparams(
        bindparam("succeeded", value=sorted(SUCCESS), expanding=True))
    async with read_txn(db) as conn:
        return [dict(r._mapping) for r in (await conn.execute(stmt)).all()]


async def bytes_by_class(db: Database) -> list[dict[str, Any]]:
    """Bytes checkpointed per class (``class_name``, ``bytes``)."""
    return await rows(db, "SELECT class_name, sum(size_bytes) AS bytes "
                          "FROM report_checkpoints GROUP BY class_name")


async def drain_row(db: Database, drain_id: str | None) -> dict[str, Any] | None:
    """``drain_id`` and ``node`` of drain ``drain_id``, or of the latest drain (``None``);
    ``None`` when there is no such drain."""
    if drain_id is None:
        found = await rows(db, "SELECT drain_id, node FROM report_drains "
                               "ORDER BY submitted_at DESC, drain_id LIMIT 1")
    else:
        found = await rows(db, "SELECT drain_id, node FROM report_drains "
                               "WHERE drain_id = :id", {"id": drain_id})
    return found[0] if found else None


async def drain_targets(db: Database, drain_id: str) -> list[dict[str, Any]]:
    """Each child of drain ``drain_id``: its ``target`` node and ``outcome``."""
    return await rows(db, "SELECT target, outcome FROM report_drain_children "
                          "WHERE drain_id = :id", {"id": drain_id})


async def drains(db: Database, *, since: datetime | None = None) -> list[dict[str, Any]]:
    """One row per drain, oldest first: node, outcome, children moved / failed / in
    flight, duration, p50/p95 of its children's durations, and failures by reason."""
    sql = "SELECT * FROM report_drains"
    params: dict[str, Any] = {}
    if since is not None:
        sql += " WHERE submitted_at >= :since"
        params["since"] = _since_param(db, since)
    children: dict[str, list[float]] = defaultdict(list)
    for row in await rows(db, "SELECT drain_id, duration_seconds FROM report_drain_children "
                              "WHERE duration_seconds IS NOT NULL"):
        children[str(row["drain_id"])].append(float(row["duration_seconds"]))
    failures: dict[str, list[str]] = defaultdict(list)
    for row in await rows(db, "SELECT drain_id, reason, children FROM report_drain_failures "
                              "ORDER BY drain_id, reason"):
        failures[str(row["drain_id"])].append(f"{row['reason']}: {int(row['children'])}")
    out = []
    for row in sorted(await rows(db, sql, params), key=lambda r: str(r["submitted_at"])):
        drain_id = str(row["drain_id"])
        times = children.get(drain_id, [])
        out.append({
            "drain": drain_id, "node": row["node"], "outcome": row["outcome"],
            "children": int(row["children"]), "succeeded": int(row["succeeded"]),
            "failed": int(row["failed"]), "in_flight": int(row["in_flight"]),
            "duration_seconds": None if row["duration_seconds"] is None
            else float(row["duration_seconds"]),
            "p50_child_seconds": percentile(times, 0.5),
            "p95_child_seconds": percentile(times, 0.95),
            "failures": "; ".join(failures.get(drain_id, [])),
        })
    return out


async def summary(db: Database, *, report: str, by: str,
                  since: datetime | None = None) -> list[dict[str, Any]]:
    """Operations, checkpoints or migrations grouped by ``kind``, ``node``, ``day`` or
    ``class``: counts, success rate (operations, migrations), p50/p95 of durations, and
    for migrations the p50 of each phase and the bytes moved."""
    view, time_col, duration = REPORTS[report]
    sql = f"SELECT * FROM {view}"
    params: dict[str, Any] = {}
    if since is not None:
        sql += f" WHERE {time_col} >= :since"
        params["since"] = _since_param(db, since)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    asked = await requesters(db) if by == "requester" else {}
    for row in await rows(db, sql, params):
        if by == "requester":
            groups[asked.get(str(row["operation_id"]), "-")].append(row)
        else:
            groups[_group_key(row, by, time_col)].append(row)
    out = []
    for key in sorted(groups):
        members = groups[key]
        entry: dict[str, Any] = {by: key, "count": len(members)}
        if report != "checkpoints":
            done = [r for r in members if r["terminal"]]
            ok = sum(1 for r in done if r["outcome"] in SUCCESS)
            entry.update(succeeded=ok, failed=len(done) - ok, running=len(members) - len(done),
                         success_rate=round(ok / len(done), 4) if done else None)
        times = _numbers(members, duration)
        entry.update(p50_seconds=percentile(times, 0.5), p95_seconds=percentile(times, 0.95))
        if report == "migrations":
            for phase in MIGRATION_PHASES:
                entry[f"p50_{phase}"] = percentile(_numbers(members, phase), 0.5)
        if report != "operations":
            entry["bytes"] = sum(int(r["size_bytes"]) for r in members
                                 if r["size_bytes"] is not None)
        out.append(entry)
    return out


async def requesters(db: Database) -> dict[str, str]:
    """Who asked for each operation: the recorder of its ``Submitted`` event (``user@host``
    and the kubeconfig's user for the CLI, ``token:<name>`` for the API, ``drain:<id>``
    for a drain's children; ``operator`` before requesters were recorded). A pruned
    operation's is kept in its summary row, which wins while both exist."""
    found = await rows(db, "SELECT machine_id, worker_id FROM events WHERE seq = 1", {})
    asked = {str(r["machine_id"]): str(r["worker_id"]) for r in found}
    for r in await rows(db, "SELECT machine_id, requester FROM operation_summaries "
                            "WHERE requester IS NOT NULL", {}):
        asked[str(r["machine_id"])] = str(r["requester"])
    return asked


def _group_key(row: dict[str, Any], by: str, time_col: str) -> str:
    if by == "day":
        stamp = row[time_col]
        return str(stamp)[:10] if stamp is not None else "-"
    if by == "node":
        return str(row["source_node"] or "-")
    if by == "class":
        return str(row["class_name"])
    return str(row.get("kind", "migration"))


def _numbers(members: Sequence[dict[str, Any]], column: str) -> list[float]:
    return [float(r[column]) for r in members if r[column] is not None]
