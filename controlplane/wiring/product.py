"""The product assembled against a cluster and a registry: the composition root.

``product(...)`` connects the Kubernetes driver (kubeconfig or in-cluster, with the
given ``KubeSettings``: ``--kube-qps``/``--kube-burst`` on the command line), wraps the
registry, and builds one worker over every machine kind: pods and nodes observed from the
watch cache, tags from the registry (``CompositeObserver``), actions performed by the
kube and registry handlers. Pod watch events wake the machines that indexed the pod's UID
or (for pods they are about to create) its ``namespace/name``, and nudge the worker — no
polling of the API server per machine. Submissions validate against ``fresh`` (the API
server itself, never a cache that may lag).

Used by ``cpctl worker --kubeconfig``, the operator verbs and ``wiring.embedded``; the one
module family in ``controlplane`` allowed to import ``drivers`` (import-linter).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.app.child_submitter import ChildSubmitter
from controlplane.app.drains import NodeRecheck
from controlplane.clock import Clock
from controlplane.engine.observation import pod_key
from controlplane.machines.catalog import default_kinds
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.machine import CHECK_NODE_PODS
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store import leases
from controlplane.store.database import Database
from controlplane.wiring.access import KubeClusterAccess
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.child_machines import StoreMachineObserver
from controlplane.worker.composite import CompositeObserver
from controlplane.worker.loop import Worker, WorkerConfig
from controlplane.worker.ports import ActionHandler
from drivers.kube import KubeDriver, KubeSettings
from drivers.registry import ManifestActions, RegistryObserver
from drivers.registry.port import Registry
from drivers.sealing.signatures import Verifier


class RunsProduct:
    """A world the product runs in: its worker and its submission observer."""

    product: Product

    @property
    def worker(self) -> Worker:
        return self.product.worker

    @property
    def submission_observer(self) -> CompositeObserver:
        return self.product.fresh

    def access(self, db: Database) -> KubeClusterAccess:
        """What the verbs' requests read the cluster through (``app.requests``): the
        demos submit as ``cpctl migrate`` does."""
        return KubeClusterAccess(self.product.kube, self.product.registry, db)


@dataclass
class Product:
    kube: KubeDriver
    registry: Registry
    worker: Worker
    #: What submissions validate against: the API server itself, not the watch cache.
    fresh: CompositeObserver


async def _noop(_action: Any) -> None:
    return None


@contextlib.asynccontextmanager
async def product(db: Database, clock: Clock, *, registry: Registry, config: WorkerConfig,
                  kubeconfig: str | None = None, context: str | None = None,
                  in_cluster: bool | None = None, kube: KubeSettings | None = None,
                  run_worker: bool = True,
                  trusted_keys: Sequence[bytes] = ()) -> AsyncIterator[Product]:
    workers: list[Worker] = []
    drivers: list[KubeDriver] = []

    async def wake(uids: list[str]) -> None:
        """Every pending pod change in one transaction: machines index pods by UID, and
        by namespace/name while they wait for a pod that does not exist yet."""
        keys = list(uids)
        for uid in uids:
            pod = drivers[0].pods.get_by_uid(uid) if drivers else None
            meta = (pod or {}).get("metadata") or {}
            if isinstance(meta, dict) and meta.get("namespace") and meta.get("name"):
                keys.append(pod_key(str(meta["namespace"]), str(meta["name"])))
        await leases.wake_by_keys(db, keys=keys, now=clock.now())
        for worker in workers:
            worker.nudge()

    driver = await KubeDriver.connect(kubeconfig=kubeconfig, context=context,
                                      in_cluster=in_cluster, settings=kube,
                                      on_pod_changes=wake)
    drivers.append(driver)
    async with driver:
        children = StoreMachineObserver(db)
        verifier = Verifier.from_pems(trusted_keys) if trusted_keys else None
        observer = CompositeObserver(cluster=driver.observer, machines=children,
                                     registry=RegistryObserver(registry, verifier=verifier))
        fresh = CompositeObserver(cluster=driver.fresh_observer, machines=children,
                                  registry=RegistryObserver(registry, verifier=verifier))
        kinds = default_kinds()
        handlers: dict[str, ActionHandler] = {
            **driver.handlers(), **ManifestActions(registry).handlers(), WORK_ACTION: _noop,
            ActionType.SUBMIT_OPERATION: ChildSubmitter(db, kinds, fresh, clock, config.limits),
            # A drain's look at its node's pods: LISTs from the API server, not the cache.
            CHECK_NODE_PODS: NodeRecheck(db, kinds, KubeClusterAccess(driver, registry, db),
                                         clock)}
        worker = Worker(db, kinds, observer,
                        ActionRunner(handlers, RetryPolicy(attempts=3)), clock, config,
                        confirm=driver.fresh_observer)
        workers.append(worker)
        task = asyncio.create_task(worker.run()) if run_worker else None
        try:
            yield Product(driver, registry, worker, fresh)
        finally:
            if task is not None:
                worker.stop()
                await task
