"""The embedded default assembled: a simulated cluster, a node agent per node, an OCI
layout on disk, the Kubernetes driver, and a worker driving every machine kind.

This is the composition root for ``cpctl demo`` (and anyone who wants the whole product
in one process): the one place besides ``cpctl sim`` where ``controlplane`` reaches into
``drivers`` (import-linter names these edges). Pod watch events wake the machines that
indexed the pod's UID (``store.leases.wake_by_key``) and nudge the worker — no polling
of the API server per machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.clock import Clock
from controlplane.engine.observation import pod_key
from controlplane.machines.registry import default_kinds
from controlplane.machines.steps import WORK_ACTION
from controlplane.store import leases
from controlplane.store.database import Database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.composite import CompositeObserver
from controlplane.worker.runtime import Worker, WorkerConfig
from drivers.agent import AgentSettings, node_agent
from drivers.agent.sim import SimDumper
from drivers.kube import KubeDriver
from drivers.registry import ManifestActions, OciLayout, RegistryObserver
from drivers.sim import SimCluster

#: How artifacts in the on-disk layout are named (``registry/repo``), as in a real one.
REGISTRY_HOST = "localhost:5000"


@dataclass
class Embedded:
    cluster: SimCluster
    kube: KubeDriver
    registry: OciLayout
    worker: Worker
    #: What submissions validate against: the API server itself, not the watch cache.
    submission_observer: CompositeObserver

    def repository(self, name: str) -> str:
        return f"{REGISTRY_HOST}/{name}"


async def _noop(_action: Any) -> None:
    return None


@contextlib.asynccontextmanager
async def embedded(db: Database, root: Path, clock: Clock, *,
                   nodes: int = 3) -> AsyncIterator[Embedded]:
    """Run the whole product in this process until the context exits."""
    workers: list[Worker] = []
    drivers: list[KubeDriver] = []

    async def wake(uid: str) -> None:
        # Machines index a pod by UID once they know it, and by namespace/name before
        # (a pod they are about to create): wake both.
        await leases.wake_by_key(db, key=uid, now=clock.now())
        pod = drivers[0].pods.get_by_uid(uid) if drivers else None
        meta = (pod or {}).get("metadata") or {}
        if isinstance(meta, dict) and meta.get("namespace") and meta.get("name"):
            key = pod_key(str(meta["namespace"]), str(meta["name"]))
            await leases.wake_by_key(db, key=key, now=clock.now())
        for worker in workers:
            worker.nudge()

    async with SimCluster(nodes=nodes) as cluster:
        kubeconfig = cluster.write_kubeconfig(root / "sim-kubeconfig.yaml")
        registry = OciLayout(root / "registry")
        kube = await KubeDriver.connect(kubeconfig=str(kubeconfig), on_pod_change=wake)
        drivers.append(kube)
        async with kube, contextlib.AsyncExitStack() as agents:
            for node in cluster.node_names:
                await agents.enter_async_context(node_agent(
                    client=kube.client, registry=registry, dumper=SimDumper,
                    settings=AgentSettings(node, root / "agents" / node,
                                           capture_timeout=60, restore_timeout=60)))
            observer = CompositeObserver(cluster=kube.observer,
                                         registry=RegistryObserver(registry))
            handlers = {**kube.handlers(), **ManifestActions(registry).handlers(),
                        WORK_ACTION: _noop}
            worker = Worker(db, default_kinds(), observer,
                            ActionRunner(handlers, RetryPolicy(attempts=3)), clock,
                            WorkerConfig(worker_id="embedded", poll_seconds=0.05,
                                         settle_seconds=0.2))
            workers.append(worker)
            task = asyncio.create_task(worker.run())
            try:
                fresh = CompositeObserver(cluster=kube.fresh_observer,
                                          registry=RegistryObserver(registry))
                yield Embedded(cluster, kube, registry, worker, fresh)
            finally:
                worker.stop()
                await task
