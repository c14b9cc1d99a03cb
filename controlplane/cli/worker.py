"""``cpctl worker``: claim due machines, decide, commit, act, until SIGTERM (or, with
``--until-done``, until every machine is settled); beside it the housekeeping (partitions
ahead, the history prune) and, with ``--metrics-listen``, its ``/metrics`` and
``/healthz``. With a cluster (``--kubeconfig`` or ``--in-cluster``) it runs the product
(``wiring.cluster``), else the engine's own kinds. Run by :mod:`controlplane.cli.main`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from dataclasses import replace

from controlplane.cli.classes import load_classes
from controlplane.cli.context import clock
from controlplane.cli.options import limits_from
from controlplane.cli.retention import parse_policy
from controlplane.cli.worker_status import Snapshot, report_status, stopped_line
from controlplane.clock import new_id
from controlplane.gc_tuning import tune_for_service
from controlplane.machines.config.classes import class_to_json
from controlplane.store import migrate, queries
from controlplane.store.database import open_database
from controlplane.wiring.engine import build_worker
from controlplane.worker.housekeeping import Housekeeping
from controlplane.worker.loop import Worker, WorkerConfig


async def worker_cmd(args: argparse.Namespace) -> int:
    tune_for_service()
    config = WorkerConfig(
        worker_id=args.worker_id or f"worker-{new_id()[:8]}",
        concurrency=args.concurrency, batch_size=args.concurrency,
        lease_seconds=args.lease_seconds, heartbeat_seconds=args.lease_seconds / 3,
        poll_seconds=args.poll_seconds,
    )
    policy = parse_policy(args.history_keep_days, flag="--history-keep-days")
    db = open_database(args.db, pool_size=max(args.concurrency + 2, 5))
    chores: asyncio.Task[None] | None = None
    try:
        if args.upgrade_schema:
            await migrate.upgrade(db)
        else:
            await migrate.require_current(db)
        # Partitions ahead and, with --history-keep-days, the prune: hourly, first now.
        chores = asyncio.create_task(Housekeeping(db, clock, policy).run())
        banner = worker_banner(args, config, db.display_url)
        if args.kubeconfig or args.in_cluster:  # the product against a cluster + registry
            from controlplane.wiring.cluster import run_product_worker

            # This worker also admits queued operations, under the verbs' limits.
            config = replace(config, limits=limits_from(args))
            classes = ({name: class_to_json(k) for name, k in
                        load_classes(args.classes_file).items()} if args.classes_file else {})
            await run_product_worker(db, args, config, lambda w: _drive(
                w, args.until_done, args.metrics_listen, banner, args.status_seconds),
                clock, classes=classes)
        else:  # the engine's own kinds only
            await _drive(build_worker(db, config, clock), args.until_done, args.metrics_listen,
                         banner, args.status_seconds)
    finally:
        if chores is not None:
            chores.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chores
        await db.dispose()
    return 0


def worker_banner(args: argparse.Namespace, config: WorkerConfig, database: str) -> str:
    """The line ``cpctl worker`` prints as it starts: who, which database and cluster,
    under which limits (the metrics address is added once it is bound)."""
    if args.kubeconfig or args.in_cluster:
        cluster = ("in-cluster" if args.in_cluster else f"kubeconfig {args.kubeconfig}") + (
            f", registry layout {args.registry_layout}" if args.registry_layout
            else ", registries over HTTP")
        limits = (f"; admits under --max-operations {args.max_operations}, "
                  f"--max-per-node {args.max_per_node}")
    else:
        cluster, limits = "none (the engine's own kinds only: --kubeconfig for the product)", ""
    return (f"worker {config.worker_id} starting: database {database}; cluster {cluster}; "
            f"concurrency {config.concurrency}, lease {config.lease_seconds:g}s{limits}")


async def _drive(worker: Worker, until_done: bool,
                 metrics_listen: str | None = None, banner: str | None = None,
                 status_seconds: float = 0.0) -> None:
    """Run ``worker`` until SIGTERM/SIGINT (draining), or until every machine settled;
    with ``metrics_listen``, serve its ``/metrics`` and ``/healthz`` meanwhile. Prints
    ``banner`` and where the metrics are, once they are served; then a status line every
    ``status_seconds`` (0: none) and, with a banner, a last line as it stops."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    async with contextlib.AsyncExitStack() as stack:
        metrics = "metrics off (--metrics-listen HOST:PORT serves /metrics and /healthz)"
        if metrics_listen is not None:
            from controlplane.cli.serve import worker_endpoints  # aiohttp only when asked

            bound = await stack.enter_async_context(worker_endpoints(worker, metrics_listen))
            metrics = f"metrics http://{bound}/metrics"
        if banner is not None:
            print(f"{banner}; {metrics}", flush=True)
        began = time.monotonic()
        status = (asyncio.create_task(report_status(worker, status_seconds))
                  if status_seconds > 0 else None)
        try:
            if until_done:
                await run_until_done(worker)
            else:
                await worker.run()
        finally:
            if status is not None:
                status.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await status
        if banner is not None:
            print(stopped_line(worker.config.worker_id, Snapshot.of(worker),
                               time.monotonic() - began), flush=True)


async def run_until_done(worker: Worker) -> None:
    """Run until every machine is settled: terminal, actions done, lease released."""
    task = asyncio.create_task(worker.run())
    try:
        while not task.done():
            await asyncio.sleep(worker.config.poll_seconds)
            live = await queries.list_machines(worker.db, queries.MachineFilter(
                settled=False, limit=1))
            if not live:
                worker.stop()
    finally:
        await task
