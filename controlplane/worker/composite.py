"""One Observer from several: pods and nodes from the cluster, tags from the registry,
other machines (a drain's children) from the store.

The worker takes a single :class:`~controlplane.worker.ports.Observer`; the composition
root builds this from the cluster driver's observer and the registry driver's. Each part
is asked only for what it serves, concurrently; a part that fails answers every key it
was asked with a ``ProbeError`` — never "absent", so safety gate 3 holds across the seam.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from controlplane.engine.observation import Interests, Observation, ProbeError
from controlplane.worker.ports import Observer


class _NoStore:
    """Stands in when no machine store was given: every machine is unknown, not absent."""

    async def observe(self, interests: Interests) -> Observation:
        error = ProbeError("NotObserved", "this observer reads no machine store", False)
        return Observation(machines=dict.fromkeys(interests.machines, error))


_NO_STORE = _NoStore()


class CompositeObserver:
    def __init__(self, *, cluster: Observer, registry: Observer,
                 machines: Observer | None = None) -> None:
        self._cluster = cluster
        self._registry = registry
        self._machines = machines

    async def observe(self, interests: Interests) -> Observation:
        cluster_part = Interests(pods=interests.pods, nodes=interests.nodes)
        registry_part = Interests(tags=interests.tags)
        machines_part = Interests(machines=interests.machines)
        cluster, registry, machines = await asyncio.gather(
            self._ask(self._cluster, cluster_part), self._ask(self._registry, registry_part),
            self._ask(self._machines or _NO_STORE, machines_part))
        return replace(cluster, tags=registry.tags, machines=machines.machines)

    @staticmethod
    async def _ask(part: Observer, interests: Interests) -> Observation:
        if interests.empty:
            return Observation()
        try:
            return await part.observe(interests)
        except Exception as exc:  # an observer must not raise; if it does, nothing is known
            error = ProbeError(type(exc).__name__, str(exc) or repr(exc), retryable=True)
            return Observation(pods=dict.fromkeys(interests.pods, error),
                               tags=dict.fromkeys(interests.tags, error),
                               nodes=dict.fromkeys(interests.nodes, error),
                               machines=dict.fromkeys(interests.machines, error))
