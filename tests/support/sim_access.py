"""``ClusterAccess`` over the embedded world: what the wiring's ``KubeClusterAccess`` reads
from the API server, read from the simulator instead (tests of the HTTP API's and the
front door's submissions)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import PodFact
from controlplane.wiring.embedded import Embedded
from controlplane.worker.ports import Observer
from drivers.kube.views import pod_view


@dataclass
class SimAccess:
    """``ClusterAccess`` over the embedded world (the wiring's reads the API server)."""

    world: Embedded

    @property
    def observer(self) -> Observer:
        return self.world.submission_observer

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        pod = self.world.cluster.pod(namespace, name)
        return None if pod is None else dict(pod)

    async def read_pod(self, namespace: str, name: str) -> tuple[JsonObject | None, PodFact]:
        pod = await self.get_pod(namespace, name)
        return pod, None if pod is None else pod_view(pod)

    async def list_nodes(self) -> list[JsonObject]:
        return [dict(n) for n in self.world.cluster.store.peek("nodes")]

    async def list_pods(self) -> list[JsonObject]:
        return [dict(p) for p in self.world.cluster.store.peek("pods")]
