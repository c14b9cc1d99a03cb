"""Scale: N concurrent migrations on the simulator through the real kube driver over HTTP.

``python -m bench.scale --migrations 10000 --nodes 100`` (``make bench-scale``), on the
local PostgreSQL (a fresh ``cp_bench_scale`` database each run):

- the world runs as separate processes (:mod:`bench.cluster`): ``python -m drivers.sim
  up`` with its data plane instant (pods start and stop at once), every node's agent
  (``sim`` dumper) in ``python -m bench.sim_agents``, an OCI layout on disk;
- this process is the control plane: ``wiring.product.product()`` (KubeDriver with its
  watch caches + registry + one worker). Its RSS and its API and registry request counts
  are the control plane's own;
- N pods ``app-i`` on node ``i mod nodes``; every one is submitted for migration to the
  next node (through ``submit_operation`` against the API server, as ``cpctl migrate``
  does: counted apart as "submission"), then the worker runs all N at once.

Reports: wall time (submission, run), transitions/s, API requests per migration by verb
(and by verb/resource) for the worker and for submission, registry requests per
migration, peak RSS, database rows and bytes per migration (live, after ``VACUUM FULL``;
and at the end of the run, with the dead row versions), and the bare PostgreSQL commit
floor of the same run; and the node agents' restore delay (p50/p99/max from each
restored pod's creation to its agent acting). Prints a table and one JSON line; writes
``bench/results/scale.json`` (or ``--json FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench import common
from bench.cluster import REGISTRY_HOST, CountingRegistry, migration_spec, sim_world
from bench.common import (
    CpuMeter,
    RssSampler,
    floors,
    footprint,
    fresh_database,
    live_footprint,
    mib,
    peak_rss_bytes,
    rss_bytes,
    write_results,
)
from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock, new_id
from controlplane.gc_tuning import tune_for_service
from controlplane.logs import configure as configure_logs
from controlplane.machines.catalog import default_kinds
from controlplane.machines.submission import Limits
from controlplane.store import leases, migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.wiring.product import product
from controlplane.worker.loop import WorkerConfig
from drivers.kube import KubeSettings
from drivers.registry import OciLayout

clock = SystemClock()


async def phases(db: Database) -> dict[str, int]:
    async with db.reader.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT kind || ':' || phase, count(*) FROM machines GROUP BY 1"))).all()
    return {str(k): int(n) for k, n in rows}


def per(counts: dict[str, int] | Counter[str], n: int) -> dict[str, float]:
    return {k: round(v / n, 3) for k, v in sorted(counts.items()) if v}


class WakeTimer:
    """Counts and times ``leases.wake_by_keys`` (one transaction per burst of pod
    changes): their total time bounds the throughput if the wakes fall behind."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._real = leases.wake_by_keys

    async def _timed(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self._real(*args, **kwargs)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - t0

    def __enter__(self) -> WakeTimer:
        leases.wake_by_keys = self._timed
        return self

    def __exit__(self, *_exc: object) -> None:
        leases.wake_by_keys = self._real


async def until_done(db: Database, started: float, *, every: float = 0.25,
                     report_every: float = 15.0) -> None:
    """Until every machine is terminal; a progress line on stderr now and then."""
    last = time.perf_counter()
    while True:
        if time.perf_counter() - last >= report_every:
            last = time.perf_counter()
            print(f"  [{last - started:6.0f} s] {await phases(db)}", file=sys.stderr,
                  flush=True)
        if not await queries.list_machines(db, queries.MachineFilter(settled=False, limit=1)):
            return
        await asyncio.sleep(every)  # the database: nothing to await


async def submit_all(db: Database, running: Any, pods: list[dict[str, Any]], nodes: int,
                     limits: Limits, concurrency: int = 16) -> list[str]:
    kinds = default_kinds()
    slots = asyncio.Semaphore(concurrency)
    ids: list[str] = []

    async def one(i: int, pod: dict[str, Any]) -> None:
        target = f"node-{(i + 1) % nodes + 1}"
        repository = f"{REGISTRY_HOST}/checkpoints/{pod['metadata']['name']}"
        async with slots:
            outcome = await submit_operation(
                db, kinds, running.fresh, kind="migration", machine_id=new_id(),
                spec=migration_spec(pod, target, repository), now=clock.now(), limits=limits)
        assert not outcome.queued, outcome.queued
        ids.append(outcome.machine_id)
        if len(ids) % 1000 == 0:  # long runs: show the submission rate as it goes
            print(f"  submitted {len(ids)} of {len(pods)}", file=sys.stderr, flush=True)

    await asyncio.gather(*(one(i, pod) for i, pod in enumerate(pods)))
    return ids


async def run_scale(*, migrations: int, nodes: int, concurrency: int = 64, qps: float = 0,
                    db_name: str | None = None, workdir: Path | None = None,
                    measure_floor: bool = True,
                    agent_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """One scale run; returns the figures (see the module docstring)."""
    tune_for_service()  # this process is the control plane, as `cpctl worker` would be
    url = await fresh_database(db_name or common.db_name("scale"))
    db = open_database(url, pool_size=20)
    results: dict[str, Any] = {"migrations": migrations, "nodes": nodes,
                               "worker_concurrency": concurrency, "client_qps": qps}
    try:
        await migrate.upgrade(db)
        if measure_floor:
            results.update(await floors(db, quick=True))
        with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=workdir) as tmp:
            setup = time.perf_counter()
            async with sim_world(Path(tmp), nodes=nodes, pods=migrations,
                                 agent_args=agent_args) as (world, pods):
                results["setup_s"] = round(time.perf_counter() - setup, 2)
                pids = {"control_plane": os.getpid(),
                        **{name: proc.pid for name, proc in world.procs.items()}}
                results.update(await drive(db, world.kubeconfig, world.layout, pods,
                                           nodes=nodes, concurrency=concurrency, qps=qps,
                                           cpu=CpuMeter(pids)))
                results["pods_running_after"] = await world.running()
                await world.stop()  # the agents write their figures as they stop
                agents = world.agent_stats()
                results["agent_restore_delay"] = agents.pop("restore_delay", {})
                results["agents"] = agents
        results["db"] = await footprint(db)
        results["db_live"] = await live_footprint(db)
    finally:
        await db.dispose()
    n = migrations
    db_rows = sum(t["rows"] for t in results["db"].values())
    db_bytes = sum(t["bytes"] for t in results["db"].values())
    results["db_rows_per_migration"] = round(db_rows / n, 2)
    results["db_bytes_per_migration"] = round(db_bytes / n)
    results["db_live_bytes_per_migration"] = round(
        sum(t["bytes"] for t in results["db_live"].values()) / n)
    results["events_per_migration"] = round(results["db"]["events"]["rows"] / n, 2)
    return results


async def drive(db: Database, kubeconfig: Path, layout: Path, pods: list[dict[str, Any]], *,
                nodes: int, concurrency: int, qps: float, cpu: CpuMeter) -> dict[str, Any]:
    n = len(pods)
    limits = Limits(max_cluster=n + 1, max_per_source_node=n + 1)
    registry = CountingRegistry(OciLayout(layout))
    config = WorkerConfig(worker_id="bench-scale", concurrency=concurrency,
                          batch_size=min(concurrency, 128), poll_seconds=0.1, limits=limits)
    sampler = RssSampler()
    sampler.start()
    rss_before = rss_bytes()
    out: dict[str, Any] = {}
    wakes = WakeTimer()
    with wakes:
        async with product(db, clock, registry=registry, config=config,
                           kubeconfig=str(kubeconfig),
                           kube=KubeSettings(qps=qps, burst=max(100, int(qps))),
                           run_worker=False) as running:
            counter = running.kube.requests
            startup = counter.snapshot()
            t0 = time.perf_counter()
            await submit_all(db, running, pods, nodes, limits)
            submitted = counter.snapshot()
            t1 = time.perf_counter()
            cpu.start()
            reg_before = Counter(registry.counts)
            by_resource_before = Counter(counter.by_resource)
            worker = running.worker
            task = asyncio.create_task(worker.run())
            worker_error = ""
            try:
                await until_done(db, t1)
            finally:
                t2 = time.perf_counter()
                used = cpu.stop()
                worker.stop()
                try:
                    await task
                except Exception as exc:  # reported, not hidden: a finding of the run
                    worker_error = repr(exc)[:500]
            worker_counts = counter.since(submitted)
            by_resource = Counter(counter.by_resource)
            by_resource.subtract(by_resource_before)
            registry_counts = Counter(registry.counts)
            registry_counts.subtract(reg_before)
            out.update({
                "startup_requests": {k: v for k, v in startup.items() if v},
                "submit_s": round(t1 - t0, 2), "run_s": round(t2 - t1, 2),
                "wall_s": round(t2 - t0, 2),
                "transitions": worker.transitions,
                # CPU of this process (the control plane) while the worker ran: a figure
                # that, unlike wall time, does not move with what else the machine runs.
                "run_cpu_s": used,
                "cpu_ms_per_migration": round(used["control_plane"] * 1000 / n, 2),
                "cpu_us_per_transition": round(used["control_plane"] * 1e6
                                               / max(1, worker.transitions)),
                "transitions_per_s": round(worker.transitions / (t2 - t1), 1),
                "migrations_per_s": round(n / (t2 - t0), 2),
                "api_requests_per_migration": round(sum(worker_counts.values()) / n, 3),
                "api_per_migration_by_verb": per(worker_counts, n),
                "api_per_migration_by_resource": per(
                    Counter({f"{v} {r}": c for (v, r), c in by_resource.items()}), n),
                "api_errors": dict(counter.errors),
                "submission_api_per_migration_by_verb": per(
                    {k: v - startup.get(k, 0) for k, v in submitted.items()}, n),
                "registry_requests_per_migration": round(sum(registry_counts.values()) / n, 3),
                "registry_per_migration_by_method": per(registry_counts, n),
                "write_batches": worker.committer.batches,
                "wake_calls_per_migration": round(wakes.calls / n, 2),
                "wake_busy_s": round(wakes.seconds, 1),
                "worker_error": worker_error,
            })
    await sampler.stop()
    out["rss_before_bytes"] = rss_before
    out["rss_peak_bytes"] = max(sampler.peak, peak_rss_bytes())
    out["phases"] = await phases(db)
    out["succeeded"] = out["phases"].get("migration:Succeeded", 0)
    return out


def print_table(r: dict[str, Any]) -> None:
    n = r["migrations"]
    print(f"scale: {n} migrations on {r['nodes']} simulated nodes (data plane instant)")
    if "floor_c1_per_s" in r:
        print(f"  bare INSERT+COMMIT floor      c=1 {r['floor_c1_per_s']:.0f}/s   "
              f"c=32 {r['floor_c32_per_s']:.0f}/s")
    print(f"  succeeded                     {r['succeeded']} of {n}  {r['phases']}")
    print(f"  wall                          {r['wall_s']:.1f} s (submit {r['submit_s']:.1f} s"
          f" + run {r['run_s']:.1f} s); setup {r['setup_s']:.1f} s")
    fl = r.get("floor_c32_per_s")
    ratio = f" ({r['transitions_per_s'] / fl:.2f}x c=32 floor)" if fl else ""
    print(f"  transitions                   {r['transitions']} "
          f"({r['transitions'] / n:.1f}/migration), {r['transitions_per_s']:.0f}/s{ratio}")
    print(f"  CPU while running (s)         {r['run_cpu_s']}")
    print(f"  control-plane CPU             "
          f"{r['cpu_ms_per_migration']:.1f} ms/migration, "
          f"{r['cpu_us_per_transition']} us/transition")
    print(f"  API requests / migration      {r['api_requests_per_migration']:.2f} "
          f"{r['api_per_migration_by_verb']}")
    print(f"    by resource                 {r['api_per_migration_by_resource']}")
    print(f"    at submission               {r['submission_api_per_migration_by_verb']}")
    print(f"  registry requests / migration {r['registry_requests_per_migration']:.2f} "
          f"{r['registry_per_migration_by_method']}")
    print(f"  pod-change wakes            {r['wake_calls_per_migration']:.1f} wake_by_keys "
          f"transactions/migration, busy {r['wake_busy_s']:.0f} s of the {r['wall_s']:.0f} s "
          f"wall (a transaction per burst of pod changes)")
    print(f"  peak RSS (control plane)      {mib(r['rss_peak_bytes'])} "
          f"(before start {mib(r['rss_before_bytes'])})")
    d = r.get("agent_restore_delay") or {}
    if d.get("count"):
        print(f"  agent restore delay           p50 {d['p50_s']:.2f} s, p99 {d['p99_s']:.2f} s,"
              f" max {d['max_s']:.1f} s, {d['over_2s']} of {d['count']} over 2 s (pod "
              f"created -> its agent acting; +<1 s: creationTimestamp is in seconds)")
    if r.get("worker_error"):
        print(f"  WORKER ERROR                  {r['worker_error'][:300]}")
    print(f"  DB per migration              {r['db_rows_per_migration']:.1f} rows, "
          f"{r['db_live_bytes_per_migration'] / 1024:.1f} KiB live (after VACUUM FULL), "
          f"{r['db_bytes_per_migration'] / 1024:.1f} KiB at the end of the run with the dead "
          f"row versions ({r['events_per_migration']:.1f} events)")


def agent_options(args: argparse.Namespace) -> tuple[str, ...]:
    out: list[str] = []
    if args.agent_watch_timeout is not None:
        out += ["--watch-timeout", str(args.agent_watch_timeout)]
    if args.agent_resync is not None:
        out += ["--resync", str(args.agent_resync)]
    return tuple(out)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--migrations", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=64, help="the worker's slots")
    p.add_argument("--qps", type=float, default=0,
                   help="the control plane's client-side API throttle (0: none; the "
                        "driver's default is 50)")
    p.add_argument("--timeout", type=float, default=1800, help="give up after (s)")
    p.add_argument("--agent-watch-timeout", type=float, help="the agents' pod watch "
                   "timeoutSeconds (default the driver's 290; shorter: more reconnects)")
    p.add_argument("--agent-resync", type=float, help="the agents' relist period (s)")
    p.add_argument("--json", type=Path, help="write the figures here "
                                             "(default bench/results/scale.json)")
    args = p.parse_args()
    configure_logs("console", "warning")
    async with asyncio.timeout(args.timeout):  # a hung run still tears its world down
        results = await run_scale(migrations=args.migrations, nodes=args.nodes,
                                  concurrency=args.concurrency, qps=args.qps,
                                  agent_args=agent_options(args))
    print_table(results)
    write_results("scale", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
