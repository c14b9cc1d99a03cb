"""The engine beside the agents' world: a SQLite store and one worker deciding on what the
Kubernetes driver (the simulated cluster) and the registry driver observe.

``open_engine`` yields the database while the worker runs; ``registry`` replaces the
registry the worker observes through (e.g. a counting one), the agents keep theirs.
Used by the end-to-end migration tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import leases, migrate
from controlplane.store.database import Database, open_database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.composite import CompositeObserver
from controlplane.worker.loop import Worker, WorkerConfig
from drivers.kube import KubeDriver
from drivers.registry import ManifestActions, RegistryObserver
from drivers.registry.port import Registry
from tests.agent.world import KUBE, World

RETRIES = RetryPolicy(attempts=2, timeout_seconds=10, backoff_base_seconds=0.01,
                      backoff_max_seconds=0.05)


@asynccontextmanager
async def open_engine(w: World, tmp_path: Path, *,
                      registry: Registry | None = None) -> AsyncIterator[Database]:
    db = open_database(f"sqlite:///{tmp_path / 'cp.db'}")
    await migrate.upgrade(db)
    clock = SystemClock()
    worker_box: list[Worker] = []

    async def wake(uid: str) -> None:
        await leases.wake_by_key(db, key=uid, now=clock.now())
        for worker in worker_box:
            worker.nudge()

    kube = await KubeDriver.connect(kubeconfig=str(tmp_path / "sim.kubeconfig"),
                                    settings=KUBE, on_pod_change=wake)
    async with kube:
        observer = CompositeObserver(cluster=kube.observer,
                                     registry=RegistryObserver(registry or w.backend.registry))
        handlers = {**kube.handlers(), **ManifestActions(w.backend.registry).handlers()}
        worker = Worker(db, default_kinds(), observer, ActionRunner(handlers, RETRIES), clock,
                        WorkerConfig(worker_id="e2e", poll_seconds=0.05, settle_seconds=0.1))
        worker_box.append(worker)
        task = asyncio.create_task(worker.run())
        try:
            yield db
        finally:
            worker.stop()
            await task
            await db.dispose()
