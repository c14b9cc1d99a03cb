"""A migration asks the registry about its artifact only when a decision needs it.

The worker observes a machine's interests on every wake, and a migration is woken often
while the node agent works (each progress annotation on the source pod is a watch
event). Probing the tag on each of those wakes cost about 9 resolves per migration
(``docs/performance.md``). Only three decisions need the registry: verifying the
artifact once the agent reports it pushed, re-checking it just before the source is
deleted (gate 1), and confirming it gone after garbage collection.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.cluster import CountingRegistry
from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import leases, migrate, queries
from controlplane.store.database import open_database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.composite import CompositeObserver
from controlplane.worker.runtime import Worker, WorkerConfig
from drivers.kube import KubeDriver
from drivers.registry import ManifestActions, RegistryObserver
from tests.agent.world import KUBE, open_world
from tests.support.waiting import eventually

NS = "default"
RETRIES = RetryPolicy(attempts=2, timeout_seconds=10, backoff_base_seconds=0.01,
                      backoff_max_seconds=0.05)
MIGRATIONS = 4


async def test_each_migration_resolves_its_artifact_at_most_three_times(
        tmp_path: Path) -> None:
    async with open_world(tmp_path, registry="layout") as w:
        names = [f"app{i}" for i in range(MIGRATIONS)]
        for name in names:
            w.cluster.create_pod(NS, name, node="node-1", marker=f"{name}=1")
        for name in names:
            await w.running(NS, name)
        db = open_database(f"sqlite:///{tmp_path / 'cp.db'}")
        await migrate.upgrade(db)
        clock = SystemClock()
        workers: list[Worker] = []

        async def wake(uid: str) -> None:
            await leases.wake_by_key(db, key=uid, now=clock.now())
            for worker in workers:
                worker.nudge()

        probes = CountingRegistry(w.backend.registry)
        kube = await KubeDriver.connect(kubeconfig=str(tmp_path / "sim.kubeconfig"),
                                        settings=KUBE, on_pod_change=wake)
        async with kube:
            observer = CompositeObserver(cluster=kube.observer,
                                         registry=RegistryObserver(probes))
            handlers = {**kube.handlers(), **ManifestActions(w.backend.registry).handlers()}
            worker = Worker(db, default_kinds(), observer, ActionRunner(handlers, RETRIES),
                            clock, WorkerConfig(worker_id="probes", poll_seconds=0.05,
                                                settle_seconds=0.1))
            workers.append(worker)
            task = asyncio.create_task(worker.run())
            try:
                for name in names:
                    await submit(db, default_kinds(), kind="migration", machine_id=name,
                                 spec=_spec(w, name), now=clock.now())

                async def finished() -> bool:
                    return all([(await queries.get_machine(db, n)).terminal for n in names])

                await eventually(finished, limit_seconds=90, what="the migrations to end")
                phases = [(await queries.get_machine(db, n)).phase for n in names]
            finally:
                worker.stop()
                await task
                await db.dispose()
    assert phases == ["Succeeded"] * MIGRATIONS
    assert probes.counts["resolve"] <= 3 * MIGRATIONS, probes.counts


def _spec(w: object, name: str) -> dict[str, object]:
    from tests.agent.world import World
    assert isinstance(w, World)
    source = w.cluster.pod(NS, name)
    assert source is not None
    return {"pod": {"namespace": NS, "name": name, "uid": source["metadata"]["uid"]},
            "source_node": "node-1", "target_node": "node-2",
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "main",
                                                  "image": "registry.k8s.io/pause:3.9"}]}},
            "class": {"repository": w.repo, "timeouts": {
                "capture": 60, "restore": 60, "schedule": 30, "gc": 60}}}
