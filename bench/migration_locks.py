"""Schema upgrades under load: how long each Alembic revision locks ``events`` and ``machines``.

``python -m bench.migration_locks [--events 1000000]`` on the local PostgreSQL (about 2
minutes at a million events; not run in CI: ``tests/upgrade`` runs it at a tiny size):

1. a fresh database is upgraded to revision 0001 and ``--events`` history rows are
   bulk-loaded server-side (``INSERT ... SELECT`` over ``generate_series``: 12 events per
   settled migration-like machine, spread over ``--months`` months up to now, one
   decision per machine), the shape the product writes at 0001;
2. the schema is upgraded one revision at a time (``store.migrate.upgrade(db, rev)``, the
   code path of ``cpctl db upgrade``: each revision its own transaction), 0002 to head.
   Meanwhile two other connections watch:

   - a lock sampler reads ``pg_locks`` in a tight loop and records, per revision and
     table, from the first to the last sample that saw a lock which blocks the workers'
     writes (``SHARE`` or stronger: ``ShareLock``, ``ShareRowExclusiveLock``,
     ``ExclusiveLock``, ``AccessExclusiveLock``) granted on ``events`` (or one of its
     partitions) or ``machines``: the time a worker's append or commit would wait;
   - a write probe does what a worker does between decisions, over and over: update one
     machine's row and read one machine's history; its slowest round per revision is the
     stall a worker saw.

Prints a table and one JSON line; writes ``bench/results/migration_locks.json``. The
figures and the bound they support are in ``docs/install.md`` ("Lock times per
revision"). NOT a test: figures vary with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from alembic.script import ScriptDirectory
from sqlalchemy import text

from bench.common import db_name, drop_database, fresh_database, write_results
from controlplane.logs import configure as configure_logs
from controlplane.store import migrate
from controlplane.store.database import Database, open_database

EVENTS_PER_MACHINE = 12
CHUNK = 250_000  # events per INSERT statement of the bulk load
#: Lock modes that block a worker's INSERT/UPDATE (which take ROW EXCLUSIVE).
BLOCKING = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")

_LOAD_MACHINES = text("""
INSERT INTO machines (id, kind, phase, version, spec, state, terminal, pending_actions,
                      next_wake_at, wake_seq, attempts, created_at, updated_at)
SELECT 'm' || i, 'migration', 'Succeeded', 12,
       jsonb_build_object('namespace', 'ns', 'pod', 'w' || i, 'target', 'node-2'),
       jsonb_build_object('phase', 'Succeeded', 'note', repeat('s', 200)), true, '[]'::jsonb,
       NULL, 0, 0,
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval),
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval)
FROM generate_series(1, CAST(:machines AS int)) AS i
""")

_LOAD_EVENTS = text("""
INSERT INTO events (machine_id, seq, type, data, facts, recorded_at, worker_id)
SELECT 'm' || i, s, (ARRAY['Submitted', 'CaptureRequested', 'ArtifactObserved',
                           'SourceDeleted', 'RestorePodCreated', 'RestoreVerified',
                           'ArtifactDeleted', 'MigrationFinished', 'StepFinished',
                           'StepFinished', 'StepFinished', 'StepFinished'])[s],
       jsonb_build_object('step', s, 'note', repeat('x', 120)),
       jsonb_build_object('pod', jsonb_build_object('uid', 'u-' || i, 'node', 'node-1')),
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval)
         + s * interval '1 second', 'bench-loader'
FROM generate_series(CAST(:lo AS int), CAST(:hi AS int)) AS i, generate_series(1, 12) AS s
ORDER BY i, s
""")

_LOAD_DECISIONS = text("""
INSERT INTO decisions (machine_id, first_seq, cause, input, decided_at)
SELECT 'm' || i, 2, 'observation', '{"observation": {}}'::jsonb,
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval)
FROM generate_series(1, CAST(:machines AS int)) AS i
""")

_LOCKS = """
SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.granted AND l.pid <> pg_backend_pid() AND l.database = (
        SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.mode = ANY($1::text[]) AND (c.relname = 'machines' OR c.relname LIKE 'events%')
"""


@dataclass
class Watch:
    """What the sampler and the probe saw while one revision ran."""

    held: dict[str, tuple[float, float, str]] = field(default_factory=dict)  # table -> span
    samples: int = 0
    widest_gap: float = 0.0  # the sampler's resolution: its longest time between samples
    probe_rounds: int = 0
    probe_worst: float = 0.0


def _table(relname: str) -> str:
    return "machines" if relname == "machines" else "events"


async def _sample(url: str, watch: list[Watch], stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    try:
        last = time.perf_counter()
        while not stop.is_set():
            rows = await conn.fetch(_LOCKS, list(BLOCKING))
            now = time.perf_counter()
            w = watch[-1]
            w.samples += 1
            w.widest_gap = max(w.widest_gap, now - last)
            last = now
            for row in rows:
                table = _table(row["relname"])
                first, _, mode = w.held.get(table, (now, now, row["mode"]))
                strongest = max(mode, row["mode"], key=BLOCKING.index)
                w.held[table] = (first, now, strongest)
    finally:
        await conn.close()


async def _probe(url: str, watch: list[Watch], stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            await conn.execute("UPDATE machines SET attempts = attempts WHERE id = 'm1'")
            await conn.fetch("SELECT seq, type FROM events WHERE machine_id = 'm2' "
                             "ORDER BY seq")
            w = watch[-1]
            w.probe_rounds += 1
            w.probe_worst = max(w.probe_worst, time.perf_counter() - t0)
            await asyncio.sleep(0.005)
    finally:
        await conn.close()


async def _load(db: Database, events: int, months: int) -> dict[str, float]:
    machines = -(-events // EVENTS_PER_MACHINE)
    now = datetime.now(UTC)
    start = now - timedelta(days=30 * months)
    step = timedelta(seconds=(now - start).total_seconds() / machines)
    t0 = time.perf_counter()
    async with db.writer.begin() as conn:
        await conn.execute(_LOAD_MACHINES, {"machines": machines, "start": start, "step": step})
        await conn.execute(_LOAD_DECISIONS, {"machines": machines, "start": start, "step": step})
    per_chunk = CHUNK // EVENTS_PER_MACHINE
    for lo in range(1, machines + 1, per_chunk):
        async with db.writer.begin() as conn:
            await conn.execute(_LOAD_EVENTS, {"lo": lo, "hi": min(lo + per_chunk - 1, machines),
                                              "start": start, "step": step})
    async with db.writer.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE"))
        loaded = await conn.scalar(text("SELECT count(*) FROM events"))
    return {"machines": machines, "events": int(loaded or 0),
            "load_seconds": time.perf_counter() - t0}


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


async def measure(events: int, months: int, keep: bool) -> dict[str, Any]:
    name = db_name("migration_locks")
    url = await fresh_database(name)
    db = open_database(url, pool_size=4)
    pg_url = url.replace("postgresql+asyncpg://", "postgresql://")
    revisions = _revisions()
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        await migrate.upgrade(db, revisions[0])
        first = {"revision": revisions[0], "seconds": time.perf_counter() - t0,
                 "note": "creates the tables (empty database)"}
        loaded = await _load(db, events, months)
        watch = [Watch()]
        stop = asyncio.Event()
        watchers = [asyncio.create_task(_sample(pg_url, watch, stop)),
                    asyncio.create_task(_probe(pg_url, watch, stop))]
        try:
            for rev in revisions[1:]:
                watch.append(Watch())
                t0 = time.perf_counter()
                await migrate.upgrade(db, rev)
                took = time.perf_counter() - t0
                await asyncio.sleep(0.05)  # the sampler's last look after the commit
                w = watch[-1]
                row: dict[str, Any] = {"revision": rev, "seconds": took,
                                       "sampler_resolution_ms": 1000 * w.widest_gap,
                                       "samples": w.samples,
                                       "probe_rounds": w.probe_rounds,
                                       "probe_worst_ms": 1000 * w.probe_worst}
                for table in ("events", "machines"):
                    span = w.held.get(table)
                    row[f"{table}_lock_ms"] = 1000 * (span[1] - span[0]) if span else 0.0
                    row[f"{table}_lock_mode"] = span[2] if span else ""
                rows.append(row)
                watch.append(Watch())  # between revisions: not charged to either
        finally:
            stop.set()
            await asyncio.gather(*watchers)
    finally:
        await db.dispose()
        if not keep:
            await drop_database(name)
    return {"loaded": loaded, "first": first, "revisions": rows}


def _print(result: dict[str, Any]) -> None:
    loaded = result["loaded"]
    print(f"\n{loaded['events']:,} events, {loaded['machines']:,} machines "
          f"(loaded at {result['first']['revision']} in {loaded['load_seconds']:.1f} s)\n")
    print(f"{'rev':>5} {'upgrade s':>10} {'events lock ms':>15} {'machines lock ms':>17} "
          f"{'probe worst ms':>15} {'res ms':>7}  strongest mode (events / machines)")
    for r in result["revisions"]:
        print(f"{r['revision']:>5} {r['seconds']:>10.2f} {r['events_lock_ms']:>15.0f} "
              f"{r['machines_lock_ms']:>17.0f} {r['probe_worst_ms']:>15.0f} "
              f"{r['sampler_resolution_ms']:>7.1f}  {r['events_lock_mode'] or '-'} / "
              f"{r['machines_lock_mode'] or '-'}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.migration_locks",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--months", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--json", default=None, help="write the JSON here, not bench/results/")
    args = p.parse_args()
    configure_logs(level="WARNING")
    result = asyncio.run(measure(args.events, args.months, args.keep))
    _print(result)
    write_results("migration_locks", result, Path(args.json) if args.json else None)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
