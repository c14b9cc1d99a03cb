"""What the JSON column type costs a rebuild's read: ``jsonb`` (what the store uses) vs ``json``.

``python -m bench.replay_storage [--parts 4] [--part 0] [--rounds 3]``, on the history
``bench.replay`` loaded (``cp_bench_replay``; run that first). A what-if, not a change: it
copies one id range's projections and events into scratch tables twice, once with the
JSON columns as ``jsonb`` and once as ``json`` (PostgreSQL keeps ``json`` as the text it
was given; ``jsonb`` is parsed into a binary tree on the way in and printed back to text
on the way out), then reads each copy the way a rebuild reads the store (batches of 2,000
machines in id order: the projection and the events' data as text, decoded with
``orjson``, the cyclic collector paused), alternating, ``--rounds`` times, and drops the copies.

Per event, for each type: PostgreSQL's CPU (its backend for this connection, from
/proc: the server must be local) and this process's CPU, and the events/s the read alone
would allow on all cores. It also checks that both copies decode to the same values, so
the difference is the type's cost alone. ``docs/performance.md`` keeps the latest figures.
Prints a table and one JSON line; writes ``bench/results/replay_storage.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench.common import cpu_seconds, db_name, write_results
from controlplane.gc_tuning import collector_paused

BATCH = 2000
TYPES = ("jsonb", "json")
_EVENTS = "whatif_events_{}"
_MACHINES = "whatif_machines_{}"


@dataclass
class Reading:
    """One read of one copy: CPU on both sides, wall time, what was read."""

    events: int
    server_s: float
    client_s: float
    wall_s: float
    digest: str


async def _copy(conn: asyncpg.Connection, kind: str, after: str, until: str | None) -> None:
    """The range's projections and events into unlogged scratch tables of type ``kind``."""
    machines, events = _MACHINES.format(kind), _EVENTS.format(kind)
    upper = "AND id <= $2" if until is not None else ""
    upper_e = "AND machine_id <= $2" if until is not None else ""
    args = (after, until) if until is not None else (after,)
    await conn.execute(f"DROP TABLE IF EXISTS {machines}, {events}")
    await conn.execute(
        f"CREATE UNLOGGED TABLE {machines} AS SELECT id, kind, phase, version, terminal, "
        f"state::text::{kind} AS state FROM machines WHERE id > $1 {upper}", *args)
    await conn.execute(
        f"CREATE UNLOGGED TABLE {events} AS SELECT machine_id, seq, type, "
        f"data::text::{kind} AS data, facts::text::{kind} AS facts, recorded_at, worker_id "
        f"FROM events WHERE machine_id > $1 {upper_e} ORDER BY position", *args)
    await conn.execute(f"CREATE UNIQUE INDEX ON {machines} (id)")
    await conn.execute(f"CREATE UNIQUE INDEX ON {events} (machine_id, seq)")
    await conn.execute(f"VACUUM ANALYZE {machines}, {events}")


async def _read(conn: asyncpg.Connection, kind: str, backend: int) -> Reading:
    """Read a copy as a rebuild reads the store, decoding every JSON value."""
    machines, events = _MACHINES.format(kind), _EVENTS.format(kind)
    ids = [r[0] for r in await conn.fetch(f"SELECT id FROM {machines} ORDER BY id")]
    digest = hashlib.blake2b(digest_size=16)
    count, checking = 0, 0.0
    server0, client0, wall0 = cpu_seconds(backend), time.process_time(), time.perf_counter()
    for start in range(0, len(ids), BATCH):
        first, last = ids[start], ids[min(start + BATCH, len(ids)) - 1]
        projections = await conn.fetch(
            f"SELECT id, kind, phase, version, terminal, state::text FROM {machines} "
            "WHERE id >= $1 AND id <= $2 ORDER BY id", first, last)
        rows = await conn.fetch(
            f"SELECT machine_id, seq, type, data::text FROM {events} "
            "WHERE machine_id >= $1 AND machine_id <= $2 ORDER BY machine_id, seq", first, last)
        states = [orjson.loads(p[5]) for p in projections]
        data = [orjson.loads(r[3]) for r in rows]
        count += len(rows)
        # Equal values give equal digests whatever the type did to key order or spacing.
        # The check is not part of a read: its CPU and time are taken out.
        check0 = time.process_time()
        digest.update(orjson.dumps([states, data], option=orjson.OPT_SORT_KEYS))
        checking += time.process_time() - check0
    wall = time.perf_counter() - wall0 - checking
    return Reading(count, cpu_seconds(backend) - server0,
                   time.process_time() - client0 - checking, wall, digest.hexdigest())


async def measure(*, parts: int, part: int, rounds: int) -> dict[str, Any]:
    if not 0 <= part < parts:
        raise SystemExit(f"--part must be in 0..{parts - 1} for --parts {parts}, got {part}")
    if rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {rounds}")
    url = f"postgresql://postgres@127.0.0.1:5432/{db_name('replay')}"
    conn = await asyncpg.connect(url)
    try:
        ids = [r[0] for r in await conn.fetch("SELECT id FROM machines ORDER BY id")]
        if not ids:
            raise SystemExit(f"no machines in {db_name('replay')}: run python -m bench.replay "
                             "first")
        lo, hi = len(ids) * part // parts, len(ids) * (part + 1) // parts
        after = ids[lo - 1] if lo else ""
        until = ids[hi - 1] if part < parts - 1 else None
        for kind in TYPES:
            await _copy(conn, kind, after, until)
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        readings: dict[str, list[Reading]] = {kind: [] for kind in TYPES}
        with collector_paused():  # as a rebuild reads
            for kind in TYPES:  # one unmeasured read each: caches warm for both
                await _read(conn, kind, backend)
            for _ in range(rounds):
                for kind in TYPES:
                    readings[kind].append(await _read(conn, kind, backend))
    finally:
        for kind in TYPES:
            await conn.execute(
                f"DROP TABLE IF EXISTS {_MACHINES.format(kind)}, {_EVENTS.format(kind)}")
        await conn.close()
    return _results(parts, part, rounds, readings)


def _results(parts: int, part: int, rounds: int,
             readings: dict[str, list[Reading]]) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    by_type: dict[str, Any] = {}
    for kind, runs in readings.items():
        events = runs[0].events
        server = min(r.server_s for r in runs) / events * 1e6  # the least disturbed round
        client = min(r.client_s for r in runs) / events * 1e6
        by_type[kind] = {
            "server_us_per_event": round(server, 2),
            "client_us_per_event": round(client, 2),
            "server_us_per_event_rounds": [round(r.server_s / events * 1e6, 2) for r in runs],
            "wall_events_per_s_best": int(events / min(r.wall_s for r in runs)),
            "ceiling_events_per_s": int(cores * 1e6 / (server + client)),
        }
    first = {kind: runs[0] for kind, runs in readings.items()}
    return {"parts": parts, "part": part, "rounds": rounds, "cores": cores,
            "events": first["jsonb"].events,
            "same_values": len({r.digest for runs in readings.values() for r in runs}) == 1,
            "types": by_type}


def print_table(r: dict[str, Any]) -> None:
    print(f"replay_storage: part {r['part']} of {r['parts']}: {r['events']:,} events, "
          f"{r['rounds']} rounds; both types decode to the same values: {r['same_values']}")
    ceiling = f"ceiling on {r['cores']} core(s)"
    print(f"  {'type':<7}{'PostgreSQL us/event':>21}{'client us/event':>17}"
          f"{'read alone, events/s':>22}{ceiling:>22}")
    for kind, t in r["types"].items():
        print(f"  {kind:<7}{t['server_us_per_event']:>21.2f}{t['client_us_per_event']:>17.2f}"
              f"{t['wall_events_per_s_best']:>22,}{t['ceiling_events_per_s']:>22,}")


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.replay_storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", type=int, default=4, metavar="N",
                   help="split the machines into N id ranges (default: %(default)s)")
    p.add_argument("--part", type=int, default=0, metavar="K",
                   help="copy and read range K of them, from 0 (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="measured reads of each copy, alternating (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write the JSON here instead of bench/results/replay_storage.json")
    args = p.parse_args()
    results = await measure(parts=args.parts, part=args.part, rounds=args.rounds)
    print_table(results)
    write_results("replay_storage", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
