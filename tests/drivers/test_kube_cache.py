"""The watch cache's own lifecycle, on the simulator: resync, HTTP 410, no spurious wakes.

Invariants pinned: a periodic resync relists without reporting unchanged objects (so it
never wakes machines for nothing); a watch refused with HTTP 410 (not just an ``ERROR``
event) also leads to a relist; stopping the cache makes it unsynced; waiting for the
first sync outlasts transient failures, ends at once on a refusal no retry fixes (403),
and when it times out, says what the last failure was.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from drivers.kube.cache import WatchCache
from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings, load_configuration
from drivers.kube.errors import ApiForbidden, ApiServerError
from drivers.kube.resources import PODS, CoreV1
from drivers.sim import SimCluster


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def api(sim: SimCluster, tmp_path: Path) -> AsyncIterator[CoreV1]:
    loaded = await load_configuration(kubeconfig=str(sim.write_kubeconfig(tmp_path / "kc")))
    client = KubeClient(ApiClient(loaded.configuration))
    yield CoreV1(client)
    await client.close()


async def test_a_resync_relists_without_reporting_unchanged_objects(
        sim: SimCluster, api: CoreV1) -> None:
    sim.create_pod("default", "steady")
    await sim.wait_for(lambda: (sim.pod("default", "steady") or {}).get("status", {}).get(
        "phase") == "Running")
    changes: list[tuple[KubeObject | None, KubeObject | None]] = []
    clock = FakeClock()
    cache = WatchCache(api, PODS, settings=KubeSettings(resync_seconds=60),
                       on_change=lambda old, new: changes.append((old, new)), clock=clock)
    cache.start()
    try:
        await cache.wait_until(lambda: cache.stats.watches == 1, limit_seconds=10)
        assert len(changes) == 1  # the first list reports the pod once
        clock.now += 61  # the resync is due; the watch ends (as its timeoutSeconds would)
        sim.faults.drop_watches()
        await cache.wait_until(lambda: cache.stats.relists == 1 and cache.stats.watches == 2,
                               limit_seconds=10)
        assert len(changes) == 1, "nothing changed, so nothing is reported"
        assert cache.stats.expired == 0
    finally:
        await cache.stop()
    assert not cache.synced


async def test_a_watch_refused_with_http_410_relists(sim: SimCluster, api: CoreV1) -> None:
    cache = WatchCache(api, PODS, settings=KubeSettings(backoff_initial=0.01))
    cache.start()
    try:
        await cache.wait_until(lambda: cache.stats.watches == 1, limit_seconds=10)
        sim.faults.fail_next("watch", code=410, resource="pods")
        sim.faults.drop_watches()
        sim.create_pod("default", "later")
        await cache.wait_until(lambda: cache.get("default/later") is not None and
                               cache.synced, limit_seconds=10)
        assert cache.stats.expired == 1
        assert cache.stats.relists == 1
    finally:
        await cache.stop()


async def test_a_first_list_failing_with_500s_is_retried_until_it_syncs(
        sim: SimCluster, api: CoreV1) -> None:
    """Transient failures are not fatal at start: the cache backs off and syncs."""
    sim.faults.fail_next("list", code=500, times=2, resource="pods")
    cache = WatchCache(api, PODS, settings=KubeSettings(backoff_initial=0.01))
    cache.start()
    try:
        await cache.wait_synced(limit_seconds=10)
        assert cache.stats.errors == 2
        assert cache.last_error is None
    finally:
        await cache.stop()


async def test_a_forbidden_first_list_ends_the_wait_for_sync_at_once(
        sim: SimCluster, api: CoreV1) -> None:
    sim.faults.forbid("list", "pods")
    cache = WatchCache(api, PODS, settings=KubeSettings(backoff_initial=0.01))
    cache.start()
    try:
        with pytest.raises(ApiForbidden):
            await asyncio.wait_for(cache.wait_synced(limit_seconds=60), 10)
    finally:
        await cache.stop()


async def test_a_sync_timeout_names_the_last_error(sim: SimCluster, api: CoreV1) -> None:
    sim.faults.fail_next("list", code=503, times=None, resource="pods")
    cache = WatchCache(api, PODS, settings=KubeSettings(backoff_initial=0.01,
                                                        backoff_max=0.02))
    cache.start()
    try:
        with pytest.raises(TimeoutError) as caught:
            await cache.wait_synced(limit_seconds=0.3)
    finally:
        await cache.stop()
    assert "first sync not reached within 0.3s" in str(caught.value)
    assert "last error: list pods in all namespaces: 503 ServiceUnavailable" in str(caught.value)
    assert isinstance(caught.value.__cause__, ApiServerError)


async def test_the_read_through_observer_sees_a_pod_the_cache_has_not_yet(
    sim: SimCluster, api: CoreV1
) -> None:
    """Submissions must not be refused on a lagging cache: read-through asks the server."""
    from controlplane.engine.observation import Interests, PodView
    from drivers.kube.cache import WatchCache
    from drivers.kube.config import KubeSettings
    from drivers.kube.observer import KubeObserver, ReadThroughObserver
    from drivers.kube.resources import NODES, PODS

    settings = KubeSettings()
    pods = WatchCache(api, PODS, settings=settings)  # never started: empty
    nodes = WatchCache(api, NODES, settings=settings)
    sim.create_pod("default", "fresh", node="node-1")
    observed = await ReadThroughObserver(KubeObserver(api, pods=pods, nodes=nodes)).observe(
        Interests(pods=frozenset({"default/fresh"}), nodes=frozenset({"node-1"})))
    assert isinstance(observed.pods["default/fresh"], PodView)
    assert observed.nodes["node-1"] is not None
