"""Recovery: N real migrations in flight, SIGKILL every worker, restart; how fast, how clean.

``python -m bench.recovery [--migrations 500] [--workers 2]`` (``make bench-recovery``):

1. the simulator and its agents as processes (:mod:`bench.cluster`, data plane instant),
   N pods, N migrations submitted as ``cpctl migrate`` does;
2. ``--workers`` product workers as processes (``cpctl worker --kubeconfig ...``, lease
   ``--lease-seconds``, as deployed) drive them; once every migration has requested its
   capture and none has finished, all workers get ``SIGKILL`` at once;
3. a fresh product worker (in this process, so its claims and API requests are seen)
   takes over. Reported from the moment the dead workers' leases expire: seconds until
   every migration in flight at the kill was claimed again, and until all finished;
4. repeated side effects: the agents' captures and restores (must equal N: no second
   capture or restore), events a migration must record once (``CaptureRequested``,
   ``SourceDeletionRequested``, ``RestorePodRequested``...) recorded twice, pods at the end
   (exactly N, each on its target node with its workload marker), and the new worker's
   API writes beyond one per transition that needs one (answered "already exists" / "not
   found": the idempotent re-decision).

Prints the bare commit floor of the same run, a table and one JSON line; writes
``bench/results/recovery.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.cluster import MARKER, CountingRegistry, sim_world
from bench.common import ROOT, db_name, floors, fresh_database, until_all_terminal, write_results
from bench.scale import phases, submit_all
from controlplane.clock import SystemClock
from controlplane.logs import configure as configure_logs
from controlplane.machines.submission import Limits
from controlplane.store import leases, migrate
from controlplane.store.database import Database, open_database
from controlplane.wiring.product import product
from controlplane.worker import loop
from controlplane.worker.loop import WorkerConfig
from drivers.kube import KubeSettings
from drivers.registry import OciLayout

clock = SystemClock()
UNTHROTTLED = KubeSettings(qps=0)  # the client throttle is not what is measured
ONCE = ("CaptureRequested", "SourceDeletionRequested", "SourceDeleted", "RestorePodRequested",
        "ArtifactVerified", "RestoreVerified", "ArtifactDeletionRequested", "MigrationFinished")


async def scalar(db: Database, sql: str) -> Any:
    async with db.reader.connect() as conn:
        return await conn.scalar(text(sql))


async def run_recovery(*, migrations: int, nodes: int, workers: int,
                       lease_seconds: float, concurrency: int = 128) -> dict[str, Any]:
    url = await fresh_database(db_name("recovery"))
    db = open_database(url, pool_size=20)
    n = migrations
    limits = Limits(max_cluster=n + 1, max_per_source_node=n + 1)
    results: dict[str, Any] = {"migrations": n, "workers_killed": workers,
                               "lease_seconds": lease_seconds, "nodes": nodes,
                               "rescuer_concurrency": concurrency}
    try:
        await migrate.upgrade(db)
        results.update(await floors(db, quick=True))
        with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
            async with sim_world(Path(tmp), nodes=nodes, pods=n) as (world, pods):
                registry = OciLayout(world.layout)
                async with product(db, clock, registry=registry, config=WorkerConfig(),
                                   kubeconfig=str(world.kubeconfig), kube=UNTHROTTLED,
                                   run_worker=False) as submitting:
                    await submit_all(db, submitting, pods, nodes, limits)
                doomed = [await _start_worker(url, world.kubeconfig, world.layout, i, n,
                                              lease_seconds, Path(tmp))
                          for i in range(workers)]
                results.update(await _kill_when_in_flight(db, doomed, n))
                results.update(await _rescue(db, world.kubeconfig, world.layout, limits,
                                             concurrency))
                end_pods = await world.list_pods()
                await world.stop()
                results["agents"] = world.agent_stats()
            results.update(_pods_check(end_pods, pods, nodes))
        results.update(await _history_check(db))
        results["phases"] = await phases(db)
    finally:
        await db.dispose()
    return results


async def _start_worker(url: str, kubeconfig: Path, layout: Path, i: int, n: int,
                        lease_seconds: float, tmp: Path) -> asyncio.subprocess.Process:
    with (tmp / f"worker-{i}.stderr").open("w") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controlplane.cli.main", "--db", url, "worker",
            "--kubeconfig", str(kubeconfig), "--registry-layout", str(layout),
            "--worker-id", f"doomed-{i}", "--lease-seconds", str(lease_seconds),
            "--poll-seconds", "0.05", "--concurrency", "64",
            "--max-operations", str(n + 1), "--max-per-node", str(n + 1), "--kube-qps", "0",
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


async def _kill_when_in_flight(db: Database, doomed: list[asyncio.subprocess.Process],
                               n: int) -> dict[str, Any]:
    """SIGKILL every worker once all N requested their capture (or one finished)."""
    t0 = time.perf_counter()
    while True:
        started = await scalar(db, "SELECT count(*) FROM machines WHERE version >= 3")
        done = await scalar(db, "SELECT count(*) FROM machines WHERE terminal")
        if started >= n or done > 0:
            break
        if time.perf_counter() - t0 > 300:
            raise RuntimeError(f"only {started} of {n} migrations started in 300 s")
        await asyncio.sleep(0.02)  # other processes: nothing to await
    for proc in doomed:
        proc.send_signal(signal.SIGKILL)
    for proc in doomed:
        await proc.wait()
    killed_at = datetime.now(UTC)
    in_flight = await scalar(db, "SELECT count(*) FROM machines WHERE NOT terminal")
    leased = await scalar(db, "SELECT count(*) FROM machines WHERE lease_owner IS NOT NULL "
                              "AND lease_expires_at > now()")
    expiry = await scalar(db, "SELECT max(lease_expires_at) FROM machines")
    pending = await scalar(db, "SELECT count(*) FROM machines "
                               "WHERE pending_actions::text <> '[]'")
    return {"in_flight_at_kill": int(in_flight), "finished_before_kill": n - int(in_flight),
            "leased_at_kill": int(leased), "outbox_pending_at_kill": int(pending),
            "phases_at_kill": await phases(db), "_killed_at": killed_at.timestamp(),
            "_expiry": (expiry or killed_at).timestamp()}


async def _rescue(db: Database, kubeconfig: Path, layout: Path, limits: Limits,
                  concurrency: int) -> dict[str, Any]:
    async with db.reader.connect() as conn:
        live = {str(r) for r in (await conn.execute(text(
            "SELECT id FROM machines WHERE NOT terminal"))).scalars()}
    first_claim: dict[str, float] = {}
    real_claim = leases.claim_due

    async def recording_claim(*args: Any, **kwargs: Any) -> Any:
        claimed = await real_claim(*args, **kwargs)
        now = datetime.now(UTC).timestamp()
        for c in claimed:
            first_claim.setdefault(c.record.id, now)
        return claimed

    registry = CountingRegistry(OciLayout(layout))
    config = WorkerConfig(worker_id="rescuer", concurrency=concurrency,
                          batch_size=min(concurrency, 128),
                          poll_seconds=0.05, limits=limits)
    loop.leases.claim_due = recording_claim  # type: ignore[attr-defined]
    try:
        async with product(db, clock, registry=registry, config=config,
                           kubeconfig=str(kubeconfig), kube=UNTHROTTLED,
                           run_worker=False) as running:
            started = datetime.now(UTC).timestamp()
            task = asyncio.create_task(running.worker.run())
            worker_error = ""
            try:
                await until_all_terminal(db, every=0.02)
                finished = datetime.now(UTC).timestamp()
            finally:
                running.worker.stop()
                try:
                    await task
                except Exception as exc:  # reported, not hidden (see the scale notes)
                    worker_error = repr(exc)[:500]
            requests = running.kube.requests
            api = dict(requests.snapshot())
            errors = dict(requests.errors)
            transitions = running.worker.transitions
    finally:
        loop.leases.claim_due = real_claim  # type: ignore[attr-defined]
    resumed = [first_claim[i] for i in live if i in first_claim]
    return {"rescuer_started_at": started, "resumed": len(resumed),
            "_resumed_at": max(resumed, default=started), "_finished_at": finished,
            "rescuer_api_requests": {k: v for k, v in api.items() if v},
            "rescuer_api_errors": errors, "rescuer_transitions": transitions,
            "rescuer_worker_error": worker_error,
            "rescuer_registry_requests": dict(registry.counts)}


def _pods_check(end: list[dict[str, Any]], start: list[dict[str, Any]],
                nodes: int) -> dict[str, Any]:
    marker_of = {p["metadata"]["annotations"][MARKER] for p in start}
    running = [p for p in end if (p.get("status") or {}).get("phase") == "Running"]
    markers = [(p["metadata"].get("annotations") or {}).get(MARKER) for p in running]
    return {"pods_at_end": len(end), "pods_running_at_end": len(running),
            "markers_preserved": sorted(m for m in markers if m) == sorted(marker_of),
            "duplicate_markers": len(markers) - len(set(markers))}


async def _history_check(db: Database) -> dict[str, Any]:
    names = ", ".join(f"'{t}'" for t in ONCE)
    async with db.reader.connect() as conn:
        repeated = (await conn.execute(text(
            f"SELECT type, count(*) FROM (SELECT machine_id, type FROM events "
            f"WHERE type IN ({names}) GROUP BY 1, 2 HAVING count(*) > 1) x GROUP BY 1"))).all()
        failed = await conn.scalar(text("SELECT count(*) FROM events "
                                        "WHERE type = 'ActionFailed'"))
    return {"once_events_repeated": {str(t): int(c) for t, c in repeated},
            "action_failed_events": int(failed or 0)}


def finish(r: dict[str, Any]) -> dict[str, Any]:
    expiry, killed = r.pop("_expiry"), r.pop("_killed_at")
    resumed, finished = r.pop("_resumed_at"), r.pop("_finished_at")
    r["lease_expiry_s_after_kill"] = round(expiry - killed, 2)
    r["all_resumed_s_after_expiry"] = round(resumed - expiry, 2)
    r["all_finished_s_after_expiry"] = round(finished - expiry, 2)
    r["all_finished_s_after_kill"] = round(finished - killed, 2)
    r["rescuer_started_s_after_kill"] = round(r.pop("rescuer_started_at") - killed, 2)
    return r


def print_table(r: dict[str, Any]) -> None:
    n = r["migrations"]
    print(f"recovery: {n} migrations, {r['workers_killed']} workers SIGKILLed "
          f"(lease {r['lease_seconds']} s), a fresh worker takes over")
    print(f"  bare INSERT+COMMIT floor  c=1 {r['floor_c1_per_s']:.0f}/s   "
          f"c=32 {r['floor_c32_per_s']:.0f}/s")
    print(f"  at the kill               {r['in_flight_at_kill']} in flight "
          f"({r['leased_at_kill']} leased, {r['outbox_pending_at_kill']} with an outbox), "
          f"{r['finished_before_kill']} finished; {r['phases_at_kill']}")
    print(f"  all resumed               {r['all_resumed_s_after_expiry']:.2f} s after lease "
          f"expiry ({r['resumed']} of {r['in_flight_at_kill']})")
    print(f"  all finished              {r['all_finished_s_after_expiry']:.2f} s after lease "
          f"expiry; {r['phases']}")
    a = r.get("agents", {})
    print(f"  side effects              captures {a.get('captures')} (dumps {a.get('dumps')}),"
          f" restores {a.get('restores')} for {n} migrations; once-events repeated "
          f"{r['once_events_repeated'] or 'none'}; ActionFailed {r['action_failed_events']}")
    print(f"  pods at end               {r['pods_at_end']} ({r['pods_running_at_end']} "
          f"running), markers preserved {r['markers_preserved']}")
    if r.get("rescuer_worker_error"):
        print(f"  WORKER ERROR              {r['rescuer_worker_error'][:300]}")
    print(f"  rescuer API requests      {r['rescuer_api_requests']} errors "
          f"{r['rescuer_api_errors']}")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--migrations", type=int, default=500)
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--workers", type=int, default=2, help="worker processes to SIGKILL")
    p.add_argument("--lease-seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=128, help="the new worker's slots")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    configure_logs("console", "warning")
    async with asyncio.timeout(900):
        results = finish(await run_recovery(migrations=args.migrations, nodes=args.nodes,
                                            workers=args.workers,
                                            lease_seconds=args.lease_seconds,
                                            concurrency=args.concurrency))
    print_table(results)
    write_results("recovery", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
