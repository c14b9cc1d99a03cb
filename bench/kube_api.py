"""API requests, their latency and the migration rate, on the simulator and on a real
kube-apiserver, in one run.

``python -m bench.kube_api --migrations 200 --nodes 3`` (``make bench-kube-api``), on the
local PostgreSQL (a fresh ``cp_bench_kube_api_<backend>`` database per backend):

- **sim**: the world of :mod:`bench.scale` (``python -m drivers.sim up``, data plane
  instant; every node's agent with the ``sim`` dumper in ``python -m bench.sim_agents``);
- **real**: etcd + kube-apiserver the envtest way (``$KUBEBUILDER_ASSETS``, see
  ``scripts/ensure-envtest``; skipped with the reason when unset), the kubelet role
  ``cpctl sim nodes`` (binds, reports Running, finishes deletions, instantly) and the
  same agents process;
- on each: N pods Running; the **anchor**, a raw write loop (``--anchor`` pod annotation
  merge patches at concurrency 16 through :class:`~drivers.kube.client.KubeClient`, i.e.
  kubernetes_asyncio); then the product in this process (``wiring.product.product()``) and
  N migrations to the next node, submitted as ``cpctl migrate`` does, run by one worker.

Reports per backend: API requests per migration by verb for the worker and for the
submission, apart; each verb's client-side p50/p99 (the driver's counter times requests
when asked); migrations/s from the first submission to the last settled migration; the
control plane's writes/s against the anchor's, and the ceiling that anchor allows; on
the real server, every client's requests by verb as the server counted them
(``apiserver_request_total``, so the agents' and kubelets' writes too) and CPU per
process. Prints a table and one JSON line; writes ``bench/results/kube_api.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import ssl
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from bench import common
from bench.cluster import SimWorld
from bench.common import CpuMeter, fresh_database, write_results
from bench.scale import clock, per, phases, submit_all, until_done
from controlplane.gc_tuning import tune_for_service
from controlplane.logs import configure as configure_logs
from controlplane.machines.submission import Limits
from controlplane.store import migrate
from controlplane.store.database import Database, open_database
from controlplane.wiring.product import product
from controlplane.worker.loop import WorkerConfig
from drivers.kube import KubeDriver, KubeSettings
from drivers.kube.metrics import RequestCounter
from drivers.kube.resources import MERGE
from drivers.registry import OciLayout
from tests.support.envtest import (
    ADMIN_TOKEN,
    ASSETS,
    Envtest,
    KubeletRole,
    start_kubelet_role,
)

WRITES = ("create", "update", "patch", "delete")
#: The server's own verbs for writes (``apiserver_request_total``'s ``verb`` label).
SERVER_WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
ANCHOR_ANNOTATION = "bench.controlplane.dev/anchor"
#: The real half starts (and stops) its own etcd, kube-apiserver and kubelet role, so an
#: existing cluster's kubeconfig, which the tests accept, is no substitute here.
NO_ASSETS = (f"no {ASSETS}: run `eval \"$(scripts/ensure-envtest)\"` first (needs "
             "../shared/envtest); the real half starts its own etcd and kube-apiserver")
#: kubernetes_asyncio against this machine's kube-apiserver at concurrency 16, measured
#: before this benchmark existed: what "the real server's ceiling" first meant.
EARLIER_ANCHOR_WRITES_PER_S = (410, 700)


class RealWorld(SimWorld):
    """kube-apiserver (envtest), the kubelet role and the agents; pods over HTTPS.

    A :class:`SimWorld` whose API server is the real one: pod setup, the agents and the
    teardown of the agents are the simulator world's.
    """

    def __init__(self, root: Path, *, assets: Path, nodes: int, node_pods: int) -> None:
        super().__init__(root, nodes=nodes, node_pods=node_pods)
        self.envtest = Envtest(assets, root / "envtest")
        self.kubelets: KubeletRole | None = None

    async def start_cluster(self) -> None:
        await asyncio.to_thread(self.envtest.start)
        self.envtest.write_kubeconfig(self.kubeconfig)
        names = [f"node-{i}" for i in range(1, self.nodes + 1)]
        self.kubelets = await asyncio.to_thread(
            start_kubelet_role, self.kubeconfig, names, self.root / "kubelets.log",
            "--node-pods", str(self.node_pods))
        self.url = self.envtest.server
        tls = ssl.create_default_context(cafile=str(self.envtest.ca_file))
        self._http = aiohttp.ClientSession(
            self.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            connector=aiohttp.TCPConnector(ssl=tls))

    def pids(self) -> dict[str, int]:
        procs = {name: proc.pid for name, proc in self.procs.items()}
        if self.kubelets is not None:
            procs["kubelets"] = self.kubelets.proc.pid
        # The envtest's own processes (no public accessor: tests never needed one).
        procs.update({name: proc.pid for name, proc in self.envtest._procs.items()})
        return procs

    async def server_requests(self) -> Counter[str]:
        """Requests the API server answered so far, by its verb label, every client."""
        assert self._http is not None
        async with self._http.get("/metrics") as r:
            r.raise_for_status()
            body = await r.text()
        counts: Counter[str] = Counter()
        for line in body.splitlines():
            if line.startswith("apiserver_request_total{"):
                verb = re.search(r'verb="([A-Z]+)"', line)
                if verb:
                    counts[verb.group(1)] += int(float(line.rsplit(" ", 1)[1]))
        return counts

    async def stop(self) -> None:
        await super().stop()
        if self.kubelets is not None:
            await asyncio.to_thread(self.kubelets.stop)
        await asyncio.to_thread(self.envtest.stop)


@contextlib.asynccontextmanager
async def world_for(backend: str, root: Path, *, nodes: int, pods: int,
                    assets: Path | None) -> AsyncIterator[
                        tuple[SimWorld, list[dict[str, Any]]]]:
    """The backend's world up, ``pods`` pods Running, agents serving; torn down on exit."""
    root.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at setup)
    node_pods = max(110, 3 * pods // nodes + 10)
    world: SimWorld
    if backend == "real":
        assert assets is not None
        world = RealWorld(root, assets=assets, nodes=nodes, node_pods=node_pods)
    else:
        world = SimWorld(root, nodes=nodes, node_pods=node_pods)
    try:
        if isinstance(world, RealWorld):
            await world.start_cluster()
        else:
            await world.start_sim()
        created = await world.create_pods(pods)
        await world.start_agents()
        yield world, created
    finally:
        await world.stop()


class LoopLag:
    """How late this process's event loop wakes a ``every``-second sleep, sampled while
    running: a request's client-side latency includes this wait, the server's does not."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.every)
            self.samples.append(max(0.0, time.perf_counter() - started - self.every))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return quantiles(self.samples)


def quantiles(seconds: list[float]) -> dict[str, float]:
    """Count, p50 and p99 (nearest rank) in milliseconds."""
    ordered = sorted(seconds)
    n = len(ordered)

    def rank(q: float) -> float:
        return round(ordered[min(n - 1, int(q * n))] * 1000, 2)

    return {"n": n, "p50_ms": rank(0.50), "p99_ms": rank(0.99)} if n else {"n": 0}


def marks(counter: RequestCounter) -> dict[str, int]:
    """How many durations each verb has so far (to slice a phase's out later)."""
    return {verb: len(d) for verb, d in (counter.durations or {}).items()}


def latencies(counter: RequestCounter, since: Mapping[str, int],
              until: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Each verb's p50/p99 over the requests between two :func:`marks`."""
    out = {}
    for verb, durations in sorted((counter.durations or {}).items()):
        end = None if until is None else until.get(verb, 0)
        part = durations[since.get(verb, 0):end]
        if part:
            out[verb] = quantiles(part)
    return out


async def anchor_writes(kubeconfig: Path, names: list[str], *, total: int,
                        concurrency: int = 16) -> dict[str, Any]:
    """``total`` merge patches of one annotation on the pods, ``concurrency`` at a time,
    through a client of its own: the write rate the server takes from one client."""
    driver = await KubeDriver.connect(kubeconfig=str(kubeconfig), settings=KubeSettings(qps=0))
    counter = driver.requests
    counter.time_requests()
    todo = iter(range(total))  # shared: each loop takes the next index

    async def loop() -> None:
        for i in todo:
            name = names[i % len(names)]
            await driver.client.request(
                "patch", "PATCH", f"/api/v1/namespaces/default/pods/{name}",
                resource="pods", namespace="default", content_type=MERGE,
                body={"metadata": {"annotations": {ANCHOR_ANNOTATION: str(i)}}})

    try:
        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await driver.close()
    return {"writes": total, "concurrency": concurrency,
            "writes_per_s": round(total / elapsed, 1),
            **quantiles((counter.durations or {}).get("patch", []))}


async def drive(db: Database, world: SimWorld, pods: list[dict[str, Any]], *, nodes: int,
                concurrency: int, qps: float, cpu: CpuMeter) -> dict[str, Any]:
    """Submit a migration per pod, run them all with one worker; counts and latencies."""
    n = len(pods)
    limits = Limits(max_cluster=n + 1, max_per_source_node=n + 1)
    config = WorkerConfig(worker_id="bench-kube-api", concurrency=concurrency,
                          batch_size=min(concurrency, 128), poll_seconds=0.1, limits=limits)
    async with product(db, clock, registry=OciLayout(world.layout), config=config,
                       kubeconfig=str(world.kubeconfig),
                       kube=KubeSettings(qps=qps, burst=max(100, int(qps))),
                       run_worker=False) as running:
        counter = running.kube.requests
        counter.time_requests()
        startup, startup_marks = counter.snapshot(), marks(counter)
        t0 = time.perf_counter()
        await submit_all(db, running, pods, nodes, limits)
        submitted, submitted_marks = counter.snapshot(), marks(counter)
        by_resource_before = Counter(counter.by_resource)
        t1 = time.perf_counter()
        cpu.start()
        lag = LoopLag()
        lag.start()
        worker = running.worker
        task = asyncio.create_task(worker.run())
        worker_error = ""
        try:
            await until_done(db, t1)
        finally:
            t2 = time.perf_counter()
            used = cpu.stop()
            loop_lag = await lag.stop()
            worker.stop()
            try:
                await task
            except Exception as exc:  # reported, not hidden: a finding of the run
                worker_error = repr(exc)[:500]
        worker_counts = counter.since(submitted)
        by_resource = Counter(counter.by_resource)
        by_resource.subtract(by_resource_before)
        submission_counts = {k: v - startup.get(k, 0) for k, v in submitted.items()}
        writes = sum(worker_counts.get(v, 0) + submission_counts.get(v, 0) for v in WRITES)
        return {
            "submit_s": round(t1 - t0, 2), "run_s": round(t2 - t1, 2),
            "wall_s": round(t2 - t0, 2),
            "migrations_per_s": round(n / (t2 - t0), 2),
            "run_cpu_s": used,
            "cpu_ms_per_migration": {k: round(v * 1000 / n, 1) for k, v in used.items()},
            # The whole world's CPU per migration, and the rate it allows if the world had
            # this machine's cores to itself (a bound that does not move with other load).
            "cpu_ms_per_migration_total": round(sum(used.values()) * 1000 / n, 1),
            "cpu_bound_migrations_per_s": round((os.cpu_count() or 1) * n
                                                / max(0.1, sum(used.values())), 1),
            "control_plane_loop_lag": loop_lag,
            "api_requests_per_migration": round(sum(worker_counts.values()) / n, 3),
            "api_per_migration_by_verb": per(worker_counts, n),
            "api_per_migration_by_resource": per(
                Counter({f"{v} {r}": c for (v, r), c in by_resource.items()}), n),
            "submission_api_per_migration_by_verb": per(submission_counts, n),
            "latency_by_verb": latencies(counter, submitted_marks),
            "submission_latency_by_verb": latencies(counter, startup_marks, submitted_marks),
            "writes_per_migration": round(writes / n, 3),
            "writes_per_s": round(writes / (t2 - t0), 1),
            "api_errors": dict(counter.errors),
            "worker_error": worker_error,
        }


async def run_backend(backend: str, *, migrations: int, nodes: int, concurrency: int,
                      qps: float, anchor: int, assets: Path | None,
                      workdir: Path | None) -> dict[str, Any]:
    """One backend's world, anchor and migrations; its figures."""
    url = await fresh_database(common.db_name(f"kube_api_{backend}"))
    db = open_database(url, pool_size=20)
    out: dict[str, Any] = {}
    try:
        await migrate.upgrade(db)
        with tempfile.TemporaryDirectory(prefix=f"bench-kube-api-{backend}-",
                                         dir=workdir) as tmp:
            setup = time.perf_counter()
            async with world_for(backend, Path(tmp), nodes=nodes, pods=migrations,
                                 assets=assets) as (world, pods):
                out["setup_s"] = round(time.perf_counter() - setup, 2)
                names = [p["metadata"]["name"] for p in pods]
                real = world if isinstance(world, RealWorld) else None
                out["loadavg_1m_before"] = round(os.getloadavg()[0], 2)
                pids = {"control_plane": os.getpid(),
                        **(real.pids() if real else
                           {name: proc.pid for name, proc in world.procs.items()})}
                if anchor:
                    before = await real.server_requests() if real else Counter()
                    meter = CpuMeter(pids)
                    meter.start()
                    out["anchor"] = await anchor_writes(world.kubeconfig, names, total=anchor)
                    out["anchor"]["cpu_ms_per_write"] = {
                        k: round(v * 1000 / anchor, 2) for k, v in meter.stop().items()}
                    if real:  # what the other clients wrote in reaction to the patches
                        during = await real.server_requests()
                        during.subtract(before)
                        out["anchor"]["server_writes"] = sum(during[v] for v in SERVER_WRITES)
                before = await real.server_requests() if real else Counter()
                out.update(await drive(db, world, pods, nodes=nodes, concurrency=concurrency,
                                       qps=qps, cpu=CpuMeter(pids)))
                if real:
                    server = await real.server_requests()
                    server.subtract(before)
                    out["server_per_migration_by_verb"] = per(server, migrations)
                    server_writes = sum(server[v] for v in SERVER_WRITES)
                    out["server_writes_per_migration"] = round(server_writes / migrations, 3)
                    out["server_writes_per_s"] = round(server_writes / out["wall_s"], 1)
                out["pods_running_after"] = await world.running()
        out["phases"] = await phases(db)
        out["succeeded"] = out["phases"].get("migration:Succeeded", 0)
    finally:
        await db.dispose()
    if "anchor" in out:
        ceiling = out["anchor"]["writes_per_s"]
        out["writes_of_anchor"] = round(out["writes_per_s"] / ceiling, 3)
        # Every write the server takes for a migration (agents' and kubelets' too, when
        # counted) spends the same budget as the control plane's.
        per_migration = out.get("server_writes_per_migration") or out["writes_per_migration"]
        out["ceiling_migrations_per_s"] = round(ceiling / per_migration, 1)
        out["of_ceiling"] = round(out["migrations_per_s"] / out["ceiling_migrations_per_s"], 3)
    return out


WIDTH = 40


def _row(label: str, values: list[str], backends: list[str] | None = None) -> None:
    """One figure per column; a figure too wide for its column gets a line per backend."""
    if backends and any(len(v) >= WIDTH for v in values):
        for backend, value in zip(backends, values, strict=True):
            print(f"  {label:<34}{backend}: {value}")
        return
    print(f"  {label:<34}" + "".join(f"{v:<{WIDTH}}" for v in values).rstrip())


def _verbs(by_verb: Mapping[str, float]) -> str:
    return " ".join(f"{v} {n:g}" for v, n in by_verb.items()) or "-"


def _lat(q: Mapping[str, float] | None) -> str:
    return f"{q['p50_ms']:.1f} / {q['p99_ms']:.1f} ({q['n']:g})" if q else "-"


def print_table(r: dict[str, Any]) -> None:
    print(f"kube_api: {r['migrations']} migrations on {r['nodes']} nodes, worker concurrency "
          f"{r['worker_concurrency']}")
    ran = {b: f for b, f in r["backends"].items() if "skipped" not in f}
    for b, f in r["backends"].items():
        if "skipped" in f:
            print(f"  {b}: skipped: {f['skipped']}")
    if not ran:
        return
    cols = list(ran.values())

    def row(label: str, values: list[str]) -> None:
        _row(label, values, list(ran))

    row("", list(ran))
    row("succeeded", [f"{f['succeeded']} of {r['migrations']}" for f in cols])
    row("wall (submit + run) s", [f"{f['wall_s']:.1f} ({f['submit_s']:.1f} + {f['run_s']:.1f})"
                                   for f in cols])
    row("migrations/s", [f"{f['migrations_per_s']:.1f}" for f in cols])
    row("worker API req/migration", [f"{f['api_requests_per_migration']:.2f}" for f in cols])
    row("  by verb", [_verbs(f["api_per_migration_by_verb"]) for f in cols])
    row("  by resource", [_verbs(f["api_per_migration_by_resource"]) for f in cols])
    row("submission API req/migration", [_verbs(f["submission_api_per_migration_by_verb"])
                                          for f in cols])
    for key, label in (("latency_by_verb", "worker"), ("submission_latency_by_verb",
                                                       "submission")):
        for verb in sorted({v for f in cols for v in f[key]}):
            row(f"{label} {verb} p50/p99 ms (n)", [_lat(f[key].get(verb)) for f in cols])
    row("control-plane writes/migration", [f"{f['writes_per_migration']:.2f}" for f in cols])
    row("control-plane writes/s", [f"{f['writes_per_s']:.0f}" for f in cols])
    row("server writes/migration (all)", [str(f.get("server_writes_per_migration", "-"))
                                           for f in cols])
    row("server requests/migration (all)", [_verbs(f.get("server_per_migration_by_verb", {}))
                                            for f in cols])
    row("server writes/s (all clients)", [str(f.get("server_writes_per_s", "-"))
                                           for f in cols])
    if all("anchor" in f for f in cols):
        row("anchor: patches/s at c=16", [
            f"{f['anchor']['writes_per_s']:.0f} (p50/p99 {f['anchor']['p50_ms']:.1f}/"
            f"{f['anchor']['p99_ms']:.1f} ms)" for f in cols])
        row("  server writes during it (all)", [str(f["anchor"].get("server_writes", "-"))
                                                 for f in cols])
        row("control-plane writes/s / anchor", [f"{f['writes_of_anchor']:.2f}" for f in cols])
        row("ceiling migrations/s (anchor)", [f"{f['ceiling_migrations_per_s']:.1f}"
                                               for f in cols])
        row("migrations/s / ceiling", [f"{f['of_ceiling']:.2f}" for f in cols])
    row("control-plane loop lag p50/p99 ms", [_lat(f["control_plane_loop_lag"])
                                                for f in cols])
    row("CPU ms per migration", [" ".join(f"{k} {v:g}" for k, v in
                                           f["cpu_ms_per_migration"].items()) for f in cols])
    row("  all processes", [f"{f['cpu_ms_per_migration_total']:g} (cores allow "
                            f"{f['cpu_bound_migrations_per_s']:g} migrations/s)" for f in cols])
    if all("anchor" in f for f in cols):
        row("anchor CPU ms per write", [" ".join(f"{k} {v:g}" for k, v in
                                                  f["anchor"]["cpu_ms_per_write"].items())
                                         for f in cols])
    row("load average (1 min) before", [str(f["loadavg_1m_before"]) for f in cols])
    row("CPU s while running", [" ".join(f"{k} {v}" for k, v in f["run_cpu_s"].items())
                                 for f in cols])
    lo, hi = EARLIER_ANCHOR_WRITES_PER_S
    print(f"  (earlier anchor on this machine: {lo}-{hi} writes/s at c=16 on the real server)")
    for b, f in ran.items():
        if f.get("worker_error"):
            print(f"  {b} WORKER ERROR {f['worker_error'][:300]}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tune_for_service()  # this process is the control plane, as `cpctl worker` would be
    results: dict[str, Any] = {"migrations": args.migrations, "nodes": args.nodes,
                               "worker_concurrency": args.concurrency, "client_qps": args.qps,
                               "anchor_writes": args.anchor,
                               "earlier_anchor_writes_per_s": list(EARLIER_ANCHOR_WRITES_PER_S),
                               "backends": {}}
    assets = os.environ.get(ASSETS)
    for backend in args.backends.split(","):
        if backend == "real" and not assets:
            print(f"kube_api: the real half is skipped: {NO_ASSETS}", file=sys.stderr)
            results["backends"]["real"] = {"skipped": NO_ASSETS}
            continue
        print(f"kube_api: {backend} ...", file=sys.stderr, flush=True)
        results["backends"][backend] = await run_backend(
            backend, migrations=args.migrations, nodes=args.nodes,
            concurrency=args.concurrency, qps=args.qps, anchor=args.anchor,
            assets=Path(assets) if assets else None, workdir=args.workdir)
    return results


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--migrations", type=int, default=200)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--backends", default="sim,real", help="comma-separated: sim, real")
    p.add_argument("--concurrency", type=int, default=64, help="the worker's slots")
    p.add_argument("--qps", type=float, default=0,
                   help="the control plane's client-side API throttle (0: none)")
    p.add_argument("--anchor", type=int, default=2000,
                   help="raw pod patches at concurrency 16 before the run (0: none)")
    p.add_argument("--workdir", type=Path, help="where the worlds' scratch folders go")
    p.add_argument("--timeout", type=float, default=1800, help="give up after (s)")
    p.add_argument("--json", type=Path, help="write the figures here "
                                             "(default bench/results/kube_api.json)")
    args = p.parse_args()
    unknown = set(args.backends.split(",")) - {"sim", "real"}
    if unknown:
        p.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    configure_logs("console", "warning")
    async with asyncio.timeout(args.timeout):  # a hung run still tears its world down
        results = await run(args)
    print_table(results)
    write_results("kube_api", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
