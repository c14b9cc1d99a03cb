"""What the use cases need from the outside world, as ports the composition root fills.

:class:`ClusterAccess` is the cluster as a submission sees it: the API server itself
(GETs and LISTs, and an :class:`~controlplane.worker.ports.Observer` that answers by GET),
never a watch cache, which may lag. Submitting one operation reads what it names and
nothing more: no list-and-watch of every pod, no worker. ``controlplane.wiring`` builds
one from the Kubernetes and registry drivers; tests may pass a fake.
"""

from __future__ import annotations

from typing import Protocol

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import PodFact
from controlplane.worker.ports import Observer


class ClusterAccess(Protocol):
    """The API server and the registry, read directly."""

    @property
    def observer(self) -> Observer:
        """Observes pods, nodes, registry tags and machines by direct reads."""
        ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        """The pod as the API server has it now (``None``: it does not exist)."""
        ...

    async def read_pod(self, namespace: str, name: str) -> tuple[JsonObject | None, PodFact]:
        """One GET of the pod: as the API server has it (``None``: it does not exist, or
        the read failed), and as machines see it (a ``ProbeError`` when the read failed)."""
        ...

    async def list_nodes(self) -> list[JsonObject]:
        """Every node, as the API server lists it now."""
        ...

    async def list_pods(self) -> list[JsonObject]:
        """Every pod in every namespace, as the API server lists it now."""
        ...
