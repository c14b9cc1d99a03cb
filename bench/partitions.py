"""Partitioned history: do claim, append and replay keep their speed?

``python -m bench.partitions [--events 10000000]`` on the local PostgreSQL:

1. engine, same run: the engine benchmark's throughput (``bench.engine_throughput``:
   claim + decide + group commit + release, concurrency 1 and 32) on a plain ``events``
   (schema at 0008) and on the partitioned one (head), ``--rounds`` rounds of both, which
   goes first alternating; then every machine's history read back (``queries.history``,
   replay's read). Ratios partitioned / plain within each round, and their median;
2. scale: ``--events`` rows bulk-loaded server-side (``INSERT ... SELECT`` over
   ``generate_series``, 12 events per settled machine, spread over ``--months`` months up
   to now, plus sleeping machines not yet due); timed: the idle
   claim (``leases.claim_due`` finding nothing due), a machine's history
   (``queries.history``; and the same read bounded by the machine's ``created_at``, which
   lets PostgreSQL skip older partitions) and appends (12 events in one transaction).
   The same rows go into two databases; one is upgraded to the partitioned layout (timed:
   the migration itself); every figure is then taken on both call by call, alternating,
   so other load on the machine falls on both alike; last the downgrade is timed.

Prints a table and one JSON line; writes ``bench/results/partitions.json``. NOT a test:
figures vary with the machine; the design and the measured figures are in
``docs/partitions.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text

from bench.common import db_name, fresh_database, write_results
from bench.engine_throughput import throughput
from controlplane.clock import SystemClock, new_id
from controlplane.logs import configure as configure_logs
from controlplane.store import codec, leases, migrate, queries
from controlplane.store.database import Database, open_database

clock = SystemClock()
PLAIN = "0008"  # the last revision with a plain events table
EVENTS_PER_MACHINE = 12
SLEEPING = 1000  # machines with a wake in the future: the claim's index is not empty
CHUNK = 500_000  # events per INSERT statement of the bulk load
# Facts as the product stores them since 0007 (compressed), the same for every row.
FACTS_Z = codec.encode({"pod": {"uid": "u-1", "node": "node-1", "phase": "Running"},
                        "observed": "2026-11-25T00:00:00Z"})

_LOAD_MACHINES = text("""
INSERT INTO machines (id, kind, phase, version, spec, state, state_z, terminal,
                      pending_actions, next_wake_at, wake_seq, attempts, created_at,
                      updated_at, workload, held)
SELECT 'm' || i, 'steps', CASE WHEN i <= CAST(:sleeping AS int) THEN 'Running' ELSE 'Succeeded' END,
       12, '{"steps": 11}'::jsonb, '{"done": 11}'::jsonb, NULL,
       i > :sleeping, '[]'::jsonb,
       CASE WHEN i <= :sleeping THEN CAST(:now AS timestamptz) + interval '1 day' END, 0, 0,
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval),
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval), 'ns/w' || i, false
FROM generate_series(1, CAST(:machines AS int)) AS i
""")

_LOAD_EVENTS = text("""
INSERT INTO events (machine_id, seq, type, data, facts, facts_z, recorded_at, worker_id,
                    cause, input_z)
SELECT 'm' || i, s, CASE WHEN s = 1 THEN 'Submitted' ELSE 'StepFinished' END,
       jsonb_build_object('step', s, 'note', repeat('x', 40)), 'null'::jsonb,
       CAST(:facts_z AS bytea),
       CAST(:start AS timestamptz) + (i - 1) * CAST(:step AS interval)
         + s * interval '1 second', 'bench-loader',
       CASE WHEN s <= 2 THEN 'engine' END, NULL
FROM generate_series(CAST(:lo AS int), CAST(:hi AS int)) AS i, generate_series(1, 12) AS s
ORDER BY i, s
""")

_APPEND = text("""
INSERT INTO events (machine_id, seq, type, data, facts, facts_z, recorded_at, worker_id)
SELECT :m, s, 'StepFinished', '{"step": 0}'::jsonb, 'null'::jsonb, NULL, :now, 'bench'
FROM generate_series(CAST(:first AS int), CAST(:first AS int) + 11) AS s
""")

_BOUNDED_HISTORY = text("""
SELECT * FROM events WHERE machine_id = :m AND recorded_at >= :created ORDER BY seq
""")


def _ms(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {"p50_ms": 1000 * statistics.median(samples),
            "p99_ms": 1000 * samples[int(0.99 * (len(samples) - 1))],
            "n": len(samples)}


async def _history_all(db: Database) -> dict[str, float]:
    async with db.reader.connect() as conn:
        ids = list((await conn.execute(text("SELECT id FROM machines ORDER BY id"))).scalars())
    t0 = time.perf_counter()
    events = 0
    for machine_id in ids:
        events += len(await queries.history(db, machine_id))
    elapsed = time.perf_counter() - t0
    return {"machines": len(ids), "events": events, "seconds": elapsed,
            "events_per_s": events / elapsed}


async def engine(rounds: int, machines: int, serial: int) -> dict[str, Any]:
    """The engine benchmark on both layouts in one run: each round runs both, the first
    alternating, and the ratio is taken within each round (the two runs next to each
    other in time) and reported as the median over rounds."""
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "partitioned": []}
    for round_ in range(rounds):
        order = ["plain", "partitioned"] if round_ % 2 == 0 else ["partitioned", "plain"]
        for layout in order:
            url = await fresh_database(db_name(f"partitions_{layout}"))
            db = open_database(url, pool_size=40)
            try:
                await migrate.upgrade(db, PLAIN if layout == "plain" else "head")
                runs[layout].append({"c1": await throughput(db, serial, 1),
                                     "c32": await throughput(db, machines, 32),
                                     "history": await _history_all(db)})
            finally:
                await db.dispose()
    ratios = {}
    for part, key in (("c1", "transitions_per_s"), ("c32", "transitions_per_s"),
                      ("history", "events_per_s")):
        per_round = [float(p[part][key]) / float(q[part][key])
                     for p, q in zip(runs["partitioned"], runs["plain"], strict=True)]
        ratios[f"{part}_{key}"] = {"median": statistics.median(per_round),
                                   "per_round": per_round}
    return {"runs": runs, "ratio_partitioned_over_plain": ratios}


async def _settle(url: str) -> None:
    """Statistics fresh, visibility map set, dirty pages written: each probe starts alike."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def _load(db: Database, events: int, months: int, now: datetime) -> dict[str, float]:
    n = max(events // EVENTS_PER_MACHINE, SLEEPING + 1)
    start = now - timedelta(days=30 * months)
    step = (now - start - timedelta(hours=1)) / n
    t0 = time.perf_counter()
    async with db.writer.begin() as conn:
        await conn.execute(_LOAD_MACHINES, {"machines": n, "sleeping": SLEEPING, "now": now,
                                            "start": start, "step": step})
    per_chunk = CHUNK // EVENTS_PER_MACHINE
    for lo in range(1, n + 1, per_chunk):
        async with db.writer.begin() as conn:
            await conn.execute(_LOAD_EVENTS, {"lo": lo, "hi": min(lo + per_chunk - 1, n),
                                              "start": start, "step": step,
                                              "facts_z": FACTS_Z})
        print(f"  loaded {min(lo + per_chunk - 1, n) * EVENTS_PER_MACHINE:,} events",
              flush=True)
    return {"machines": n, "events": n * EVENTS_PER_MACHINE,
            "seconds": time.perf_counter() - t0}


class _Calls:
    """The timed operations on one database: idle claim, history, bounded history, append."""

    def __init__(self, db: Database, ids: list[str], created: dict[str, datetime]) -> None:
        self.db, self.ids, self.created = db, ids, created
        self.next_seq = [EVENTS_PER_MACHINE + 1] * SLEEPING
        self.now = clock.now()

    async def idle_claim(self, _: int) -> None:
        got = await leases.claim_due(self.db, owner="bench", token=new_id(), now=self.now,
                                     limit=32, lease_seconds=30)
        assert got == []

    async def history(self, i: int) -> None:
        assert len(await queries.history(self.db, self.ids[i])) == EVENTS_PER_MACHINE

    async def history_bounded_by_created_at(self, i: int) -> None:
        async with self.db.reader.connect() as conn:
            rows = (await conn.execute(_BOUNDED_HISTORY, {
                "m": self.ids[i], "created": self.created[self.ids[i]]})).all()
        assert len(rows) == EVENTS_PER_MACHINE

    async def append_12_events(self, i: int) -> None:
        # Sleeping machines (the live ones) get 12 more events each, recorded now.
        k = i % SLEEPING
        async with self.db.writer.begin() as conn:
            await conn.execute(_APPEND, {"m": f"m{1 + k}", "first": self.next_seq[k],
                                         "now": clock.now()})
        self.next_seq[k] += 12


OPERATIONS = ("idle_claim", "history", "history_bounded_by_created_at", "append_12_events")


async def _calls(db: Database, machines: int, samples: int) -> _Calls:
    stride = max((machines - SLEEPING) // samples, 1)
    ids = [f"m{SLEEPING + 1 + (i * stride) % (machines - SLEEPING)}" for i in range(samples)]
    async with db.reader.connect() as conn:
        rows = await conn.execute(text(
            "SELECT id, created_at FROM machines WHERE id = ANY(CAST(:ids AS varchar[]))"),
            {"ids": ids})
        created = {r.id: r.created_at for r in rows}
    return _Calls(db, ids, created)


async def _lockstep(layouts: dict[str, _Calls], samples: int) -> dict[str, dict[str, Any]]:
    """Each operation on every layout in turn, call by call (the order alternating), so
    the other load on the machine falls on both alike."""
    out: dict[str, dict[str, Any]] = {name: {} for name in layouts}
    names = list(layouts)
    for op in OPERATIONS:
        timings: dict[str, list[float]] = {name: [] for name in layouts}
        for warm in range(min(samples, 20)):  # caches and prepared statements
            for name in names:
                await getattr(layouts[name], op)(warm)
        for i in range(samples):
            for name in names if i % 2 == 0 else reversed(names):
                t0 = time.perf_counter()
                await getattr(layouts[name], op)(i)
                timings[name].append(time.perf_counter() - t0)
        for name in layouts:
            out[name][op] = _ms(timings[name])
    return out


async def scale(events: int, months: int, samples: int) -> dict[str, Any]:
    """The same rows loaded into two databases, one upgraded to partitioned (timed);
    every figure then measured on both in lockstep; last, the downgrade (timed)."""
    now = clock.now()
    dbs: dict[str, Database] = {}
    urls: dict[str, str] = {}
    results: dict[str, Any] = {}
    try:
        for layout in ("plain", "partitioned"):
            urls[layout] = await fresh_database(db_name(f"partitions_scale_{layout}"))
            dbs[layout] = db = open_database(urls[layout], pool_size=10)
            await migrate.upgrade(db, PLAIN)
            print(f"{layout}:", flush=True)
            results["load"] = await _load(db, events, months, now)
        t0 = time.perf_counter()
        await migrate.upgrade(dbs["partitioned"])
        results["upgrade_seconds"] = time.perf_counter() - t0
        async with dbs["partitioned"].reader.connect() as conn:
            results["partitions"] = (await conn.execute(text(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass"))
            ).scalar_one()
        for url in urls.values():
            await _settle(url)
        machines = int(results["load"]["machines"])
        layouts = {name: await _calls(db, machines, samples) for name, db in dbs.items()}
        results.update(await _lockstep(layouts, samples))
        t0 = time.perf_counter()
        await migrate.downgrade(dbs["partitioned"], PLAIN)
        results["downgrade_seconds"] = time.perf_counter() - t0
    finally:
        for db in dbs.values():
            await db.dispose()
    results["p50_ratio_partitioned_over_plain"] = {
        op: results["partitioned"][op]["p50_ms"] / results["plain"][op]["p50_ms"]
        for op in OPERATIONS}
    return results


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machines", type=int, default=2000, help="engine: machines at c=32")
    p.add_argument("--machines-serial", type=int, default=200, help="engine: machines at c=1")
    p.add_argument("--rounds", type=int, default=4, help="engine: runs of each layout")
    p.add_argument("--events", type=int, default=10_000_000, help="scale: events loaded")
    p.add_argument("--months", type=int, default=12, help="scale: months they span")
    p.add_argument("--samples", type=int, default=500, help="scale: timed calls per figure")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--json", type=Path, help="default bench/results/partitions.json")
    args = p.parse_args()
    configure_logs("console", "warning")
    results: dict[str, Any] = {"started": datetime.now(UTC).isoformat()}
    if not args.skip_engine:
        results["engine"] = await engine(args.rounds, args.machines, args.machines_serial)
        for name, ratio in results["engine"]["ratio_partitioned_over_plain"].items():
            rounds = ", ".join(f"{r:.2f}" for r in ratio["per_round"])
            print(f"engine {name:24s} partitioned/plain: median {ratio['median']:.3f} "
                  f"(rounds: {rounds})")
    if not args.skip_scale:
        results["scale"] = s = await scale(args.events, args.months, args.samples)
        print(f"{s['load']['events']:,} events in {s['partitions']} partitions; "
              f"upgrade to partitioned {s['upgrade_seconds']:.0f}s, downgrade "
              f"{s['downgrade_seconds']:.0f}s")
        for key, ratio in s["p50_ratio_partitioned_over_plain"].items():
            print(f"{key:30s} p50 ms: plain {s['plain'][key]['p50_ms']:6.3f}, partitioned "
                  f"{s['partitioned'][key]['p50_ms']:6.3f}: ratio {ratio:.2f}   p99 ms: "
                  f"{s['plain'][key]['p99_ms']:.3f} / {s['partitioned'][key]['p99_ms']:.3f}")
    write_results("partitions", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
