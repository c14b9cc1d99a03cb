"""What a submission reads of the cluster: ``app.ports.ClusterAccess`` over the API server.

A ``KubeDriver`` that is connected but never started: no watch, no informer, no list of
every pod; each question is one GET (or one LIST for a drain's plan), answered by the
API server itself, never by a cache that may lag. The observer is the driver's
read-through one, with the registry and the store's machines beside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import PodFact
from controlplane.store.database import Database
from controlplane.worker.child_machines import StoreMachineObserver
from controlplane.worker.composite import CompositeObserver
from controlplane.worker.ports import Observer
from drivers.kube import KubeDriver, KubeSettings
from drivers.kube.errors import ApiNotFound, KubeApiError
from drivers.kube.observer import probe_error
from drivers.kube.resources import NODES, PODS
from drivers.kube.views import pod_view
from drivers.registry import RegistryObserver
from drivers.registry.port import Registry


class KubeClusterAccess:
    """The API server and the registry, read directly (see the module docstring)."""

    def __init__(self, driver: KubeDriver, registry: Registry, db: Database) -> None:
        self.driver = driver
        self._observer = CompositeObserver(cluster=driver.fresh_observer,
                                           registry=RegistryObserver(registry),
                                           machines=StoreMachineObserver(db))

    @property
    def observer(self) -> Observer:
        return self._observer

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        try:
            return dict(await self.driver.api.get(PODS, name, namespace=namespace))
        except ApiNotFound:
            return None

    async def read_pod(self, namespace: str, name: str) -> tuple[JsonObject | None, PodFact]:
        try:
            pod = dict(await self.driver.api.get(PODS, name, namespace=namespace))
        except ApiNotFound:
            return None, None
        except KubeApiError as exc:
            return None, probe_error(exc)
        return pod, pod_view(pod)

    async def list_nodes(self) -> list[JsonObject]:
        nodes, _ = await self.driver.api.list_all(NODES)
        return [dict(n) for n in nodes]

    async def list_pods(self) -> list[JsonObject]:
        pods, _ = await self.driver.api.list_all(PODS)
        return [dict(p) for p in pods]


@contextlib.asynccontextmanager
async def cluster_access(db: Database, *, registry: Registry, kubeconfig: str | None = None,
                         context: str | None = None, in_cluster: bool | None = None,
                         kube: KubeSettings | None = None) -> AsyncIterator[KubeClusterAccess]:
    """Connect to the cluster for reads only (nothing started), closed on the way out."""
    driver = await KubeDriver.connect(kubeconfig=kubeconfig, context=context,
                                      in_cluster=in_cluster, settings=kube)
    try:
        yield KubeClusterAccess(driver, registry, db)
    finally:
        await driver.close()
