"""Read the reporting views (migration 0003) for ``cpctl report`` and tests.

The views are plain SQL for operators (``docs/reporting.md``); this module only reads
them, and computes what SQLite cannot (percentiles) in Python, identically on both
backends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from controlplane.store.database import Database
from controlplane.store.session import read_txn

SUCCESS = frozenset({"Succeeded", "Suspended", "Resumed"})
VIEWS = ("report_operations", "report_checkpoints", "report_daily")


async def rows(db: Database, sql: str, params: dict[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """Run a read-only query; rows as dicts."""
    async with read_txn(db) as conn:
        result = await conn.execute(text(sql), params or {})
        return [dict(r._mapping) for r in result.all()]


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def summary(db: Database, *, report: str, by: str,
                  since: datetime | None = None) -> list[dict[str, Any]]:
    """Operations or checkpoints grouped by ``kind``, ``node`` or ``day``: counts, success
    rate (operations), p50/p95 of durations."""
    if report == "operations":
        view, time_col, duration = "report_operations", "submitted_at", "duration_seconds"
    else:
        view, time_col, duration = "report_checkpoints", "verified_at", "capture_seconds"
    sql = f"SELECT * FROM {view}"
    params: dict[str, Any] = {}
    if since is not None:
        sql += f" WHERE {time_col} >= :since"
        # SQLite keeps UTC text in one fixed format (see schema.UtcDateTime): compare alike.
        params["since"] = (since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
                           if db.backend == "sqlite" else since)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in await rows(db, sql, params):
        if by == "day":
            stamp = row[time_col]
            key = str(stamp)[:10] if stamp is not None else "-"
        elif by == "node":
            key = row["source_node"] or "-"
        else:
            key = row["kind"]
        groups[key].append(row)
    out = []
    for key in sorted(groups):
        members = groups[key]
        times = [float(r[duration]) for r in members if r[duration] is not None]
        entry: dict[str, Any] = {by: key, "count": len(members)}
        if report == "operations":
            done = [r for r in members if r["terminal"]]
            ok = sum(1 for r in done if r["outcome"] in SUCCESS)
            entry.update(succeeded=ok, failed=len(done) - ok, running=len(members) - len(done),
                         success_rate=round(ok / len(done), 4) if done else None)
        entry.update(p50_seconds=_percentile(times, 0.5), p95_seconds=_percentile(times, 0.95))
        out.append(entry)
    return out
