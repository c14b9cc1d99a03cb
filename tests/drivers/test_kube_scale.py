"""The driver at scale: 1,000 pods and 10,000+ watch events, with watches dropped and expired.

Invariants pinned:

- after a workload of creates, annotation patches (through the store and through the
  driver's own ``AnnotatePod``), deletes, same-name recreations and node changes over
  several namespaces — with watches ended, cut mid-stream, expired (``ERROR 410``),
  refused with HTTP 410, resumed into compacted history and failing with 500s in the
  middle — the pod and node caches hold exactly what a LIST from the server returns:
  the same keys, UIDs, resourceVersions and annotations, and the UID index agrees;
- every pod the server holds at the end has woken its machine by UID;
- observing all 1,000 pods (and every node) through the Observer, several times over,
  costs zero API requests while the caches are synced: no request per machine per tick.

The workload is generated from a seeded RNG and the faults land at fixed points of it,
so a failure replays. Writes go in batches; between batches the test yields to the
event loop (``asyncio.sleep(0)``: a yield so the streams interleave with the writes,
never a wait for a condition) — conditions are awaited on cache changes with a limit.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, NodeView, PodView
from drivers.kube.cache import WatchCache
from drivers.kube.config import KubeSettings
from drivers.kube.driver import KubeDriver
from drivers.kube.resources import NODES, PODS
from drivers.sim import SimCluster
from drivers.sim.store import STRATEGIC, Change
from tests.drivers.harness import Wakes

NAMESPACES = tuple(f"scale-{i}" for i in range(5))
POD_COUNT = 1_000  # at the end: 1,150 created, 300 deleted, 150 of them recreated
CREATED = 1_150
NODE_COUNT = 12  # 110 pods each: room for every pod
EVENTS_WANTED = 10_000
OBSERVE_ROUNDS = 5
LIMIT = 30.0  # seconds any one condition may take

Table = dict[str, tuple[str, str, dict[str, str]]]


def _table(objects: Any) -> Table:
    """key -> (uid, resourceVersion, annotations): what must agree with the server."""
    out: Table = {}
    for obj in objects:
        m = obj["metadata"]
        key = f"{m['namespace']}/{m['name']}" if m.get("namespace") else m["name"]
        out[key] = (m["uid"], m["resourceVersion"], dict(m.get("annotations") or {}))
    return out


def _diff(cache: Table, server: Table) -> str:
    missing = sorted(server.keys() - cache.keys())[:5]
    extra = sorted(cache.keys() - server.keys())[:5]
    stale = sorted(k for k in cache.keys() & server.keys() if cache[k] != server[k])[:5]
    return f"missing {missing}, extra {extra}, stale {[(k, cache[k], server[k]) for k in stale]}"


class Workload:
    """Seeded writes against the simulator's store (and, for some patches, the driver)."""

    def __init__(self, cluster: SimCluster, kube: KubeDriver, seed: int = 7) -> None:
        self.cluster = cluster
        self.kube = kube
        self.rng = random.Random(seed)
        self.live: list[tuple[str, str]] = []  # (namespace, name) of pods not being deleted
        self.serial = 0

    async def create(self, count: int) -> None:
        for i in range(count):
            self.serial += 1
            ns, name = NAMESPACES[self.serial % len(NAMESPACES)], f"pod-{self.serial:05d}"
            self.cluster.create_pod(ns, name, labels={"app": f"a{self.serial % 7}"},
                                    marker=str(self.serial))
            self.live.append((ns, name))
            await self._yield(i)

    async def patch(self, count: int) -> None:
        for i in range(count):
            self.patch_one(i)
            await self._yield(i)

    def patch_one(self, i: int) -> None:
        ns, name = self.rng.choice(self.live)
        value = None if self.rng.random() < 0.2 else str(i)
        self.cluster.store.patch("pods", ns, name, STRATEGIC, {"metadata": {
            "annotations": {f"k{self.rng.randrange(4)}": value, "seq": str(i)}}})

    async def patch_through_the_driver(self, count: int) -> None:
        """``AnnotatePod`` actions, 20 at a time, with the pods' current UIDs."""
        annotate = self.kube.handlers()["AnnotatePod"]
        for start in range(0, count, 20):
            actions = []
            for i in range(start, min(start + 20, count)):
                ns, name = self.rng.choice(self.live)
                pod = self.cluster.pod(ns, name)
                assert pod is not None
                actions.append(Action("AnnotatePod", f"scale/{i}", {
                    "namespace": ns, "name": name, "uid": pod["metadata"]["uid"],
                    "annotations": {"driver": str(i)}}))
            await asyncio.gather(*(annotate(a) for a in actions))

    async def delete(self, count: int, *, recreate_every: int = 2) -> None:
        for i in range(count):
            ns, name = self.live.pop(self.rng.randrange(len(self.live)))
            self.cluster.store.delete("pods", ns, name)
            if i % recreate_every == 0:  # the same name again, with a new UID, later on
                self.cluster.settle()  # the kubelet's final delete frees the name
                self.cluster.create_pod(ns, name, marker=f"again-{i}")
                self.live.append((ns, name))
            await self._yield(i)

    async def churn_nodes(self) -> None:
        names = self.cluster.node_names
        for name in names[:4]:
            self.cluster.cordon(name)
            self.cluster.taint(name, "scale/test", str(self.rng.randrange(9)))
            await asyncio.sleep(0)
        for name in names[4:7]:
            self.cluster.fail_node(name)  # its pods turn Ready=False: a burst of events
            await asyncio.sleep(0)
        for name in names[:7]:
            self.cluster.recover_node(name)
            self.cluster.uncordon(name)
            await asyncio.sleep(0)

    @staticmethod
    async def _yield(i: int) -> None:
        if i % 50 == 49:
            await asyncio.sleep(0)


async def _reopened(kube: KubeDriver, cluster: SimCluster) -> None:
    """Until a pod watch newer than every watch open now is open (a fault can hit it)."""
    before = set(cluster.hub.watches)
    await kube.pods.wait_until(
        lambda: any(w.resource.plural == "pods" and w not in before
                    for w in cluster.hub.watches),
        limit_seconds=LIMIT, what="a new pod watch")


async def _caught_up(kube: KubeDriver, last_pod_change: list[int]) -> None:
    """Until the pod cache has seen the latest pod change (its stream has nothing queued,
    so a fault injected now reaches it at once, not behind a random cut)."""
    await kube.pods.wait_until(
        lambda: int(kube.pods.resource_version or 0) >= last_pod_change[0],
        limit_seconds=LIMIT, what="the latest pod change")


async def _converged(cache: WatchCache, server: Table) -> None:
    try:
        await cache.wait_until(lambda: cache.synced and _table(cache) == server,
                               limit_seconds=LIMIT, what="the server's state")
    except TimeoutError:
        pytest.fail(f"{cache.kind.plural} cache differs from the server: "
                    f"{_diff(_table(cache), server)}")


@pytest.mark.slow
async def test_the_caches_match_the_server_after_10000_events_with_watches_dropped(
        tmp_path: Path) -> None:
    async with SimCluster(nodes=NODE_COUNT, namespaces=("default", *NAMESPACES),
                          seed=11) as cluster:
        changes: Counter[str] = Counter()
        last_pod_change = [0]

        def count(change: Change) -> None:
            changes[change.resource] += 1
            if change.resource == "pods":
                last_pod_change[0] = change.rv

        cluster.store.subscribe(count)
        wakes = Wakes()
        path = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        faults = cluster.faults
        kube = await KubeDriver.connect(kubeconfig=str(path), on_pod_change=wakes,
                                        settings=_settings())
        async with kube:
            await _first_watch(kube)
            faults.drop_watch_rate(0.0005, abrupt=True)  # a few random cuts throughout
            work = Workload(cluster, kube)

            await work.create(CREATED // 2)
            faults.drop_watches()  # an ordinary end of stream, mid-workload
            await work.create(CREATED - CREATED // 2)
            await _reopened(kube, cluster)

            await work.patch(1_500)
            faults.drop_watches(abrupt=True)  # cut: what was in flight is lost ...
            await work.patch(500)  # ... and these never reach that stream
            await _reopened(kube, cluster)  # resumed from the last version it saw

            await work.patch(1_500)
            await _caught_up(kube, last_pod_change)
            faults.expire_watches()  # ERROR 410 mid-stream: relist
            await work.patch(500)
            await _reopened(kube, cluster)

            await work.patch_through_the_driver(300)
            # In one synchronous step: cut, write, compact. The resume version is gone,
            # so the watch gets 410 at once and the cache relists.
            faults.drop_watches(abrupt=True)
            for i in range(100):
                work.patch_one(i)
            faults.compact()
            await work.delete(300)
            await _reopened(kube, cluster)

            await _caught_up(kube, last_pod_change)
            faults.fail_next("watch", code=410, resource="pods")  # 410 as the HTTP status
            faults.fail_next("watch", code=500, resource="pods", times=2)  # then backoff
            faults.drop_watches()
            await work.churn_nodes()
            await work.patch(1_500)
            await _reopened(kube, cluster)

            faults.clear()
            cluster.settle()
            assert changes["pods"] + changes["nodes"] >= EVENTS_WANTED, changes

            pods, _ = await kube.api.list_all(PODS)  # through the API, as any client
            nodes, _ = await kube.api.list_all(NODES)
            server_pods, server_nodes = _table(pods), _table(nodes)
            assert len(server_pods) == POD_COUNT
            await _converged(kube.pods, server_pods)
            await _converged(kube.nodes, server_nodes)
            for key, (uid, _, _) in server_pods.items():
                indexed = kube.pods.get_by_uid(uid)
                assert indexed is not None, key
                assert _table([indexed]) == {key: server_pods[key]}
            for uid, _, _ in server_pods.values():
                await wakes.wait_for(uid, limit_seconds=LIMIT)

            stats = kube.pods.stats
            assert stats.expired >= 3, stats  # ERROR event, compacted resume, HTTP 410
            assert stats.relists >= 3, stats
            assert stats.errors >= 2, stats
            assert stats.watches >= 8, stats
            assert faults.injected["watch drop"] >= 1, faults.injected

            await _observe_without_requests(cluster, kube, server_pods, server_nodes)


def _settings() -> KubeSettings:
    # resync off: the caches must stay right by watch, resume and relist alone.
    return KubeSettings(resync_seconds=0, backoff_initial=0.01, backoff_max=0.1,
                        sync_timeout=LIMIT)


async def _first_watch(kube: KubeDriver) -> None:
    await kube.pods.wait_until(lambda: kube.pods.stats.watches >= 1,
                               limit_seconds=LIMIT, what="the first pod watch")


async def _observe_without_requests(cluster: SimCluster, kube: KubeDriver,
                                   server_pods: Table, server_nodes: Table) -> None:
    interests = Interests(pods=frozenset(server_pods), nodes=frozenset(server_nodes))
    client_before = kube.requests.snapshot()
    server_before = Counter(cluster.requests)
    for _ in range(OBSERVE_ROUNDS):
        seen = await kube.observer.observe(interests)
        assert len(seen.pods) == len(server_pods)
        for key, (uid, version, notes) in server_pods.items():
            pod = seen.pods[key]
            assert isinstance(pod, PodView), (key, pod)
            assert (pod.uid, pod.resource_version, dict(pod.annotations)) == (uid, version, notes)
        assert all(isinstance(n, NodeView) for n in seen.nodes.values())
    assert kube.requests.since(client_before) == {}, "the observer read the API server"
    served = Counter(cluster.requests)
    served.subtract(server_before)
    assert +served == Counter(), "the simulator was asked during the observations"
