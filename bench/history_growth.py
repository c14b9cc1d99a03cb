"""History at scale: bytes per migration and database size at 10,000 and 100,000
migrations, with and without retention.

``python -m bench.history_growth [--sizes 10000,100000] [--days 365] [--keep-days 30]``
(``make bench-history``), each size on a fresh ``cp_bench_history`` database:

1. template: ``--template`` (100) real migrations on the simulator
   (:func:`bench.scale.run_scale`), so the rows are the product's own;
2. load: the template cloned (:func:`bench.replay.clone`) until the database holds
   ``size`` migrations, spread evenly over the last ``--days`` days (a history that grew
   at ``size / days`` migrations a day), the monthly partitions of those days made first
   (``partitions.create_ahead``);
3. without retention: rows and bytes of the history tables, live (after ``VACUUM FULL``),
   per migration, and the database's size;
4. with retention: ``cpctl history prune --keep-days`` as the worker's schedule runs it
   (:func:`controlplane.store.retention.prune`), timed; then the same figures: on disk
   as the prune leaves it (dropped partitions return their space at once, deleted rows
   only to later inserts) and live; plus the reports over all time
   (``report_operations`` by kind and outcome: count, total seconds) before and after,
   which must be equal.

Prints a table and one JSON line; writes ``bench/results/history_growth.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import db_name, footprint, live_footprint, mib, write_results
from bench.replay import clone
from bench.scale import run_scale
from controlplane.clock import SystemClock
from controlplane.logs import configure as configure_logs
from controlplane.store import partitions, retention
from controlplane.store.database import Database, open_database

DB_NAME = db_name("history")
URL = f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}"
clock = SystemClock()


async def database_bytes(db: Database) -> int:
    async with db.reader.connect() as conn:
        return int(await conn.scalar(text("SELECT pg_database_size(current_database())"))
                   or 0)


async def all_time_report(db: Database) -> list[tuple[str, str, int, float]]:
    """``cpctl report operations`` over all time, as SQL: per kind and outcome."""
    async with db.reader.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT kind, outcome, count(*), round(CAST(coalesce(sum(duration_seconds), 0) "
            "AS numeric), 3) FROM report_operations GROUP BY kind, outcome "
            "ORDER BY kind, outcome"))).all()
    return [(str(k), str(o), int(n), float(s)) for k, o, n, s in rows]


def _per(tables: dict[str, dict[str, int]], n: int) -> dict[str, Any]:
    total = sum(t["bytes"] for t in tables.values())
    rows = sum(t["rows"] for t in tables.values())
    return {"tables": tables, "bytes": total, "bytes_per_migration": round(total / n),
            "rows_per_migration": round(rows / n, 2)}


async def one_size(size: int, *, template: int, days: int, keep_days: int) -> dict[str, Any]:
    scale = await run_scale(migrations=template, nodes=min(template, 20), db_name=DB_NAME,
                            measure_floor=False)
    assert scale["succeeded"] == template, scale["phases"]
    db = open_database(URL, pool_size=4)
    try:
        now = clock.now()
        made = await partitions.create_ahead(db, now=now - timedelta(days=days),
                                             months=days // 28 + 3)
        t0 = time.perf_counter()
        await clone(db, size // template - 1, spread=timedelta(days=days))
        out: dict[str, Any] = {"migrations": size, "days": days, "keep_days": keep_days,
                               "partitions_made": len(made),
                               "load_s": round(time.perf_counter() - t0, 1)}
        out["kept_all"] = {**_per(await live_footprint(db), size),
                           "database_bytes": await database_bytes(db)}
        before = await all_time_report(db)
        t0 = time.perf_counter()
        report = await retention.prune(db, policy=retention.Policy(default_days=keep_days),
                                       now=now, batch=1000)
        out["prune_s"] = round(time.perf_counter() - t0, 1)
        out["pruned"] = {"summarized": report.summarized,
                         "events_deleted": report.events_deleted,
                         "partitions_dropped": len(report.partitions_dropped)}
        out["after_prune_on_disk"] = {**_per(await footprint(db), size),
                                      "database_bytes": await database_bytes(db)}
        out["reports_equal"] = await all_time_report(db) == before
        out["after_prune_live"] = {**_per(await live_footprint(db), size),
                                   "database_bytes": await database_bytes(db)}
        return out
    finally:
        await db.dispose()


async def run(sizes: list[int], *, template: int, days: int, keep_days: int
              ) -> dict[str, Any]:
    return {"template_migrations": template,
            "sizes": [await one_size(n, template=template, days=days, keep_days=keep_days)
                      for n in sizes]}


def show(results: dict[str, Any]) -> None:
    print(f"history growth: {results['template_migrations']} real migrations cloned, "
          "PostgreSQL; KiB per migration (rows per migration)")
    for r in results["sizes"]:
        kept, disk, live = r["kept_all"], r["after_prune_on_disk"], r["after_prune_live"]
        print(f"  {r['migrations']:>7,} migrations over {r['days']} days: loaded in "
              f"{r['load_s']} s")
        print(f"    everything kept          {kept['bytes_per_migration'] / 1024:6.1f} KiB "
              f"({kept['rows_per_migration']:.1f} rows), history {mib(kept['bytes'])}, "
              f"database {mib(kept['database_bytes'])}")
        print(f"    --keep-days {r['keep_days']:<4}         pruned "
              f"{r['pruned']['summarized']:,} in {r['prune_s']} s "
              f"({r['pruned']['partitions_dropped']} partitions dropped); "
              f"reports over all time equal: {r['reports_equal']}")
        print(f"      on disk after prune    {disk['bytes_per_migration'] / 1024:6.1f} KiB "
              f"({disk['rows_per_migration']:.2f} rows), history {mib(disk['bytes'])}, "
              f"database {mib(disk['database_bytes'])}")
        print(f"      live after prune       {live['bytes_per_migration'] / 1024:6.1f} KiB "
              f"({live['rows_per_migration']:.2f} rows), history {mib(live['bytes'])}, "
              f"database {mib(live['database_bytes'])}")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000",
                   help="migrations in each run, comma-separated (default 10000,100000)")
    p.add_argument("--template", type=int, default=100,
                   help="real migrations cloned to reach each size (default 100)")
    p.add_argument("--days", type=int, default=365,
                   help="the history is spread over this many days (default 365)")
    p.add_argument("--keep-days", type=int, default=30,
                   help="the retention policy applied (default 30)")
    p.add_argument("--json", type=Path, help="write the figures here instead of "
                   "bench/results/history_growth.json")
    args = p.parse_args()
    configure_logs("console", "warning")
    results = await run([int(s) for s in args.sizes.split(",")], template=args.template,
                        days=args.days, keep_days=args.keep_days)
    show(results)
    write_results("history_growth", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
