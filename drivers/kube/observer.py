"""The :class:`~controlplane.worker.ports.Observer` for Kubernetes: pods and nodes.

Answers ``Interests.pods`` (``namespace/name`` keys) and ``Interests.nodes`` from the
watch caches — no API request per machine — and falls back to a direct GET when the
cache cannot be trusted for that key: not synced yet, recovering from a watch error or a
410, or the pod's namespace outside the cache's scope.

A cache proves a pod's presence, never its absence: a pod the cache does not hold is
read through, and only a 404 says "absent". A synced cache can lag the server by the
watch events in flight, and a pod created a moment ago is exactly the pod a machine
decides on next (a restore attempt's pod, seen by another worker's cache, read through
by this one, or listed by a relist answered before it existed). Trusting that absence
judged a running restore "vanished" and rolled back beside it: one workload, two Running
pods (``docs/reliability.md``, bugs 1 and 5). The price is one GET per absent pod a
machine asks about, about one per migration (the source's deletion, confirmed).

A read that fails is a ``ProbeError`` carrying the API reason (``Forbidden``,
``Timeout``...), never ``None`` (safety gate 3). Nodes are long-lived and no decision
that could duplicate a workload rests on a node's absence: a synced node cache answers
both ways.

Registry tags are not this driver's: asked for, they come back as a non-retryable
``ProbeError`` so that a missing registry observer can never read as "no such tag".
Called by the worker runtime (through the driver, or composed with the registry's).
"""

from __future__ import annotations

from controlplane.engine.observation import (
    Interests,
    NodeFact,
    Observation,
    PodFact,
    ProbeError,
    TagFact,
)
from drivers.kube.cache import WatchCache
from drivers.kube.errors import ApiNotFound, KubeApiError
from drivers.kube.resources import NODES, PODS, CoreV1, Kind
from drivers.kube.views import node_view, pod_view

NO_REGISTRY = ProbeError("NotObserved", "the Kubernetes observer does not read registry "
                         "tags; compose it with a registry observer", retryable=False)


def probe_error(exc: KubeApiError) -> ProbeError:
    return ProbeError(exc.reason, str(exc), retryable=exc.retryable)


class KubeObserver:
    """Pods and nodes from the watch caches; a pod's absence always from the server."""

    def __init__(self, api: CoreV1, *, pods: WatchCache, nodes: WatchCache) -> None:
        self.api = api
        self.pods = pods
        self.nodes = nodes

    async def observe(self, interests: Interests) -> Observation:
        pods = {key: await self.pod(key) for key in sorted(interests.pods)}
        nodes = {name: await self.node(name) for name in sorted(interests.nodes)}
        tags: dict[str, TagFact] = {ref: NO_REGISTRY for ref in interests.tags}
        return Observation(pods=pods, tags=tags, nodes=nodes)

    async def pod(self, key: str) -> PodFact:
        namespace, sep, name = key.partition("/")
        if not sep or not namespace or not name:
            return ProbeError("BadKey", f"pod key {key!r} is not namespace/name", False)
        if self.pods.synced and self.pods.covers(namespace):
            cached = self.pods.get(key)
            if cached is not None:
                return pod_view(cached)
        found = await self._read(PODS, name, namespace)
        return found if found is None or isinstance(found, ProbeError) else pod_view(found)

    async def node(self, name: str) -> NodeFact:
        if self.nodes.synced:
            cached = self.nodes.get(name)
            return None if cached is None else node_view(cached)
        found = await self._read(NODES, name, None)
        return found if found is None or isinstance(found, ProbeError) else node_view(found)

    async def read_pod(self, key: str) -> PodFact:
        """The pod as the API server has it now (no cache)."""
        namespace, sep, name = key.partition("/")
        if not sep or not namespace or not name:
            return ProbeError("BadKey", f"pod key {key!r} is not namespace/name", False)
        found = await self._read(PODS, name, namespace)
        return found if found is None or isinstance(found, ProbeError) else pod_view(found)

    async def read_node(self, name: str) -> NodeFact:
        """The node as the API server has it now (no cache)."""
        found = await self._read(NODES, name, None)
        return found if found is None or isinstance(found, ProbeError) else node_view(found)

    async def _read(self, kind: Kind, name: str,
                    namespace: str | None) -> dict[str, object] | ProbeError | None:
        try:
            found = await self.api.get(kind, name, namespace=namespace)
        except ApiNotFound:
            return None
        except KubeApiError as exc:
            return probe_error(exc)
        return dict(found)


class ReadThroughObserver:
    """Pods and nodes read from the API server every time, never from a cache.

    For decisions that must not rest on a cache that may lag the server by a watch
    event: refusing a submission as "unknown pod" because the pod was created a moment
    ago would be wrong. Machines use :class:`KubeObserver` (no request per machine per
    tick); submission uses this one (a few requests per submission).
    """

    def __init__(self, observer: KubeObserver) -> None:
        self._observer = observer

    async def observe(self, interests: Interests) -> Observation:
        pods = {key: await self._observer.read_pod(key) for key in sorted(interests.pods)}
        nodes = {name: await self._observer.read_node(name)
                 for name in sorted(interests.nodes)}
        tags: dict[str, TagFact] = {ref: NO_REGISTRY for ref in interests.tags}
        return Observation(pods=pods, tags=tags, nodes=nodes)
