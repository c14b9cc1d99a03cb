"""The cluster a driver contract test runs against: the simulator, or a real cluster.

A :class:`Harness` gives a test a kubeconfig, a namespace, node names, an independent
"admin" client (to change the world behind the driver's back), unique pod names, and
the fault hooks (:attr:`Harness.faults`). Pods a test creates are deleted (grace 0) when
it ends.

How faults reach a real server: on "real" the harness starts a
:class:`~drivers.sim.faultproxy.FaultProxy` per test in front of the real API server and
hands the driver a kubeconfig pointing at the proxy, so ``h.faults`` is the proxy's
:class:`~drivers.sim.faults.Faults`: the simulator's rules, applied to the requests the
driver sends, everything else answered by the real server (``compact()`` compacts the
envtest etcd, and the proxy answers older resumes with the 410 itself: the real server's
watch cache would still replay them). The ``admin`` client talks to the real server
directly and never meets a fault; a test that wants a request of its own to meet one
uses :meth:`Harness.client`.
What only the simulator can do (a bookmark on demand, reading its store) is asked for
with :meth:`Harness.sim_only`, which skips on a real cluster with the reason given. On
the simulator the driver and the admin client both talk to the simulated server, so
``admin`` requests pass its fault hooks too.

Real cluster: the session's ``real_cluster`` (tests/conftest.py): an envtest
kube-apiserver started from ``KUBEBUILDER_ASSETS`` with the kubelet role providing nodes, or
the cluster named by ``CONTROLPLANE_TEST_KUBECONFIG`` (optionally
``CONTROLPLANE_TEST_CONTEXT``, ``CONTROLPLANE_TEST_NAMESPACE`` (default ``default``),
``CONTROLPLANE_TEST_IMAGE``). The credentials need get/list/watch/create/patch/delete on
pods and events in that namespace and get/list/watch on nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings, load_configuration
from drivers.kube.driver import KubeDriver
from drivers.kube.errors import ApiNotFound
from drivers.kube.resources import NODES, PODS, CoreV1
from drivers.sim import SimCluster
from drivers.sim.faultproxy import EtcdHistory, FaultProxy
from drivers.sim.faults import Faults
from tests.support.envtest import RealCluster

PAUSE_IMAGE = os.environ.get("CONTROLPLANE_TEST_IMAGE", "registry.k8s.io/pause:3.9")


class Wakes:
    """Records ``on_pod_change`` calls; :meth:`wait_for` awaits one without polling."""

    def __init__(self) -> None:
        self.uids: list[str] = []
        self._seen = asyncio.Event()

    def __call__(self, uid: str) -> None:
        self.uids.append(uid)
        self._seen.set()

    async def wait_for(self, uid: str, *, limit_seconds: float, after: int = 0) -> None:
        """Until ``uid`` was woken (at or after call number ``after``)."""
        async with asyncio.timeout(limit_seconds):
            while uid not in self.uids[after:]:
                self._seen.clear()
                await self._seen.wait()


@dataclass
class Harness:
    kubeconfig: Path
    context: str | None
    namespace: str
    admin: CoreV1
    cluster: SimCluster | None
    patience: float  # how long a condition may take (a real cluster pulls images)
    nodes: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    proxy: FaultProxy | None = None  # real: the faults in front of the real server

    @property
    def faults(self) -> Faults:
        if self.cluster is not None:
            return self.cluster.faults
        if self.proxy is None:
            pytest.skip("needs fault hooks: no fault proxy in front of this cluster")
        return self.proxy.faults

    def sim_only(self, reason: str) -> SimCluster:
        """The simulated cluster, or skip on a real one saying why the test needs it."""
        if self.cluster is None:
            pytest.skip(f"simulator only: {reason}")
        return self.cluster

    @contextlib.asynccontextmanager
    async def client(self, *, request_timeout: float = 30.0) -> AsyncIterator[CoreV1]:
        """A client on the driver's path (through the faults), unlike ``admin`` on a
        real cluster."""
        api = await _admin(self.kubeconfig, self.context)
        api.client.request_timeout = request_timeout
        try:
            yield api
        finally:
            await api.client.close()

    def name(self, base: str) -> str:
        return f"{base}-{uuid.uuid4().hex[:6]}"

    def pod_body(self, name: str, *, node: str | None = None,
                 annotations: Mapping[str, str] | None = None) -> KubeObject:
        spec: KubeObject = {"containers": [{"name": "main", "image": PAUSE_IMAGE}],
                            "terminationGracePeriodSeconds": 1}
        if node is not None:
            spec["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                           "values": [node]}]}]}}}
        return {"metadata": {"name": name, "labels": {"test": "driver-contract"},
                             "annotations": dict(annotations or {})}, "spec": spec}

    async def make_pod(self, name: str, *, node: str | None = None,
                       annotations: Mapping[str, str] | None = None) -> KubeObject:
        self.created.append(name)
        return await self.admin.create(PODS, self.pod_body(name, node=node,
                                                           annotations=annotations),
                                       namespace=self.namespace)

    async def delete_now(self, name: str) -> None:
        with contextlib.suppress(ApiNotFound):
            await self.admin.delete(PODS, name, namespace=self.namespace,
                                    grace_period_seconds=0)

    async def pod(self, name: str) -> KubeObject | None:
        try:
            return await self.admin.get(PODS, name, namespace=self.namespace)
        except ApiNotFound:
            return None

    def settings(self, **overrides: Any) -> KubeSettings:
        # Scoped to the test namespace: namespaced RBAC is enough on a real cluster.
        base = KubeSettings(backoff_initial=0.05, backoff_max=0.5, sync_timeout=self.patience,
                            namespace=self.namespace)
        return dataclasses.replace(base, **overrides)

    @contextlib.asynccontextmanager
    async def driver(self, wakes: Wakes | None = None,
                     **overrides: Any) -> AsyncIterator[KubeDriver]:
        kube = await KubeDriver.connect(kubeconfig=str(self.kubeconfig), context=self.context,
                                        settings=self.settings(**overrides),
                                        on_pod_change=wakes)
        async with kube:
            yield kube


async def _admin(kubeconfig: Path, context: str | None) -> CoreV1:
    loaded = await load_configuration(kubeconfig=str(kubeconfig), context=context)
    return CoreV1(KubeClient(ApiClient(loaded.configuration), request_timeout=30))


@contextlib.asynccontextmanager
async def open_harness(kind: str, tmp_path: Path,
                       real: RealCluster | None = None) -> AsyncIterator[Harness]:
    if kind == "sim":
        async with SimCluster(nodes=3) as cluster:
            path = cluster.write_kubeconfig(tmp_path / "kubeconfig")
            admin = await _admin(path, None)
            harness = Harness(path, None, "default", admin, cluster, patience=10.0,
                              nodes=list(cluster.node_names))
            try:
                yield harness
            finally:
                await admin.client.close()
        return
    if real is None:
        raise ValueError("a real harness needs the session's real cluster")
    context = os.environ.get("CONTROLPLANE_TEST_CONTEXT") or None
    admin = await _admin(real.kubeconfig, context)
    history = _NoEtcd() if real.envtest is None else \
        EtcdHistory(f"http://127.0.0.1:{real.envtest.etcd_port}")
    proxy = FaultProxy.from_kubeconfig(real.kubeconfig, context=context, history=history)
    try:
        await proxy.start()
        nodes, _ = await admin.list_all(NODES)
        harness = Harness(proxy.write_kubeconfig(tmp_path / "faultproxy.kubeconfig"), None,
                          os.environ.get("CONTROLPLANE_TEST_NAMESPACE", "default"),
                          admin, None, patience=120.0,
                          nodes=sorted(str(n["metadata"]["name"]) for n in nodes
                                       if _usable(n)), proxy=proxy)
        try:
            yield harness
        finally:
            for name in harness.created:
                await harness.delete_now(name)
    finally:
        await proxy.stop()
        await admin.client.close()


class _NoEtcd:
    """The history of a cluster named by kubeconfig: its etcd is out of reach."""

    def compact(self) -> int:
        pytest.skip("compacts etcd: only possible on the envtest cluster (its etcd is known)")


def _usable(node: KubeObject) -> bool:
    """A Ready, schedulable node without NoSchedule taints (test pods can land there)."""
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    spec = node.get("spec") or {}
    tainted = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
    return ready and not spec.get("unschedulable") and not tainted
