"""Growth: the per-migration cost at 100, 1,000 and 10,000, and an idle tick vs history.

``python -m bench.growth [--sizes 100,1000,10000] [--history-events 1000000]``
(``make bench-growth``):

1. :func:`bench.scale.run_scale` at each size (100 nodes, one fresh database each): the
   per-migration figures side by side with their ratio to the smallest size — flat
   means ~1.0 (API requests, registry requests, transitions, DB rows and bytes, and the
   control plane's CPU seconds per migration);
2. idle tick: what a worker with nothing to do costs per poll (its loop: the admitter's
   "anything held?" read + a claim that finds nothing), timed over many ticks on an empty
   schema and again with ``--history-events`` historical events (real migrations cloned,
   :func:`bench.replay.load_history`): the ratio must stay ~1.0.

Prints the bare commit floor of the same run, a table and one JSON line; writes
``bench/results/growth.json`` (and, without ``--json``, each size's full scale figures
to ``bench/results/scale-<n>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, db_name, floors, fresh_database, write_results
from bench.replay import URL as HISTORY_URL
from bench.replay import load_history
from bench.replay import loaded as loaded_history
from bench.scale import run_scale
from controlplane.clock import SystemClock
from controlplane.logs import configure as configure_logs
from controlplane.machines.submission import Limits
from controlplane.store import leases, migrate
from controlplane.store.database import Database, open_database
from controlplane.worker.admitter import admit_held

clock = SystemClock()
FLAT = ("api_requests_per_migration", "registry_requests_per_migration",
        "transitions_per_migration", "db_rows_per_migration", "db_bytes_per_migration",
        "cpu_s_per_migration", "wall_ms_per_migration")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def idle_tick(db: Database, ticks: int = 300) -> float:
    """Mean milliseconds of one idle worker poll (admitter check + an empty claim)."""
    limits = Limits(max_cluster=10, max_per_source_node=2)
    for _ in range(20):  # warm the pool and the prepared statements
        await admit_held(db, limits, now=clock.now())
        await leases.claim_due(db, owner="idle", token="t", now=clock.now(), limit=32,
                               lease_seconds=30)
    t0 = time.perf_counter()
    for i in range(ticks):
        await admit_held(db, limits, now=clock.now())
        claimed = await leases.claim_due(db, owner="idle", token=f"t{i}", now=clock.now(),
                                         limit=32, lease_seconds=30)
        assert not claimed
    return 1000 * (time.perf_counter() - t0) / ticks


async def idle_ticks(history_events: int) -> dict[str, Any]:
    empty = open_database(await fresh_database(db_name("idle")), pool_size=4)
    try:
        await migrate.upgrade(empty)
        empty_ms = await idle_tick(empty)
    finally:
        await empty.dispose()
    loaded = await loaded_history(history_events) or await load_history(events=history_events)
    full = open_database(HISTORY_URL, pool_size=4)
    try:
        full_ms = await idle_tick(full)
    finally:
        await full.dispose()
    return {"history_events": loaded["db"]["events"]["rows"],
            "history_machines": loaded["db"]["machines"]["rows"],
            "idle_tick_ms_empty": round(empty_ms, 3), "idle_tick_ms_history": round(full_ms, 3),
            "idle_tick_ratio": round(full_ms / empty_ms, 2)}


async def run_growth(sizes: list[int], nodes: int, history_events: int, *,
                     save_runs: bool = False, from_results: bool = False) -> dict[str, Any]:
    url = await fresh_database(db_name("floor"))
    db = open_database(url, pool_size=40)
    try:
        results: dict[str, Any] = await floors(db, quick=True)
    finally:
        await db.dispose()
    runs = []
    for n in sizes:
        saved = RESULTS / f"scale-{n}.json"
        if from_results and saved.exists():  # a run made earlier (e.g. the long one)
            earlier = json.loads(saved.read_text())
            missing = [k for k in FLAT if k not in earlier]
            if missing:  # e.g. `bench.scale --json` output: no whole-process CPU figure
                raise SystemExit(f"{saved} was not written by bench.growth (it lacks "
                                 f"{', '.join(missing)}): delete it or run without "
                                 "--from-results")
            runs.append(earlier)
            continue
        cpu0 = _cpu()
        r = await run_scale(migrations=n, nodes=nodes, measure_floor=False)
        r["cpu_s_per_migration"] = round((_cpu() - cpu0) / n, 5)
        r["transitions_per_migration"] = round(r["transitions"] / n, 2)
        r["wall_ms_per_migration"] = round(1000 * r["wall_s"] / n, 1)
        runs.append(r)
        if save_runs:  # every figure of each size, as bench.scale would write it
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"scale-{n}.json").write_text(json.dumps(r, indent=2, sort_keys=True))
    base = runs[0]
    results["sizes"] = sizes
    results["runs"] = [{k: r[k] for k in (
        "migrations", "succeeded", "wall_s", "transitions_per_s", "rss_peak_bytes",
        "api_per_migration_by_verb", "worker_error", *FLAT)} for r in runs]
    results["ratios_to_smallest"] = {
        str(r["migrations"]): {k: round(r[k] / base[k], 2) if base[k] else None for k in FLAT}
        for r in runs}
    if history_events:
        results["idle"] = await idle_ticks(history_events)
    return results


def print_table(r: dict[str, Any]) -> None:
    print(f"growth: per-migration cost at {r['sizes']} (ratio to {r['sizes'][0]} in brackets)")
    print(f"  bare INSERT+COMMIT floor  c=1 {r['floor_c1_per_s']:.0f}/s   "
          f"c=32 {r['floor_c32_per_s']:.0f}/s")
    header = "  figure".ljust(36) + "".join(f"{n:>20}" for n in r["sizes"])
    print(header)
    for key in ("succeeded", "wall_s", "transitions_per_s", *FLAT):
        cells = []
        for run in r["runs"]:
            ratio = r["ratios_to_smallest"][str(run["migrations"])].get(key)
            cell = f"{run[key]:g}" + (f" ({ratio:.2f})" if ratio is not None else "")
            cells.append(f"{cell:>20}")
        print(f"  {key}".ljust(36) + "".join(cells))
    if "idle" in r:
        i = r["idle"]
        print(f"  idle tick: {i['idle_tick_ms_empty']:.2f} ms on an empty schema, "
              f"{i['idle_tick_ms_history']:.2f} ms with {i['history_events']:,} historical "
              f"events ({i['history_machines']:,} machines): ratio {i['idle_tick_ratio']:.2f}")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,10000",
                   help="comma-separated migration counts")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--history-events", type=int, default=1_000_000,
                   help="historical events for the idle tick (0: skip it)")
    p.add_argument("--from-results", action="store_true",
                   help="take each size's figures from bench/results/scale-<n>.json when "
                        "present instead of running it (the idle tick still runs, on the "
                        "history bench.replay left if it is large enough)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    configure_logs("console", "warning")
    results = await run_growth([int(s) for s in args.sizes.split(",")], args.nodes,
                               args.history_events, save_runs=args.json is None,
                               from_results=args.from_results)
    print_table(results)
    write_results("growth", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
