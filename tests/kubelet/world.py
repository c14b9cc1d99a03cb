"""The cluster a kubelet-role test runs against: the simulator with its own kubelets off and
the role in-process, or the session's real API server with the role as ``cpctl sim nodes``.

A :class:`World` gives a test an admin client, the role's node names, unique pod names
(in ``default``; a real server's namespaces never finish deleting without a controller
manager, so pods are named uniquely instead and deleted with grace 0 at the end), node
edits that are undone at the end (the real server is shared by the session), and
:meth:`World.wait_pod`, which polls the API with a deadline (on a real server the role is
another process: there is no event to await in this one).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import load_configuration
from drivers.kube.errors import ApiNotFound
from drivers.kube.resources import MERGE, NODES, PODS, CoreV1
from drivers.kubelet import KubeletRole, RoleOptions
from drivers.sim import SimCluster
from tests.support.envtest import NODES as NODE_NAMES
from tests.support.envtest import RealCluster
from tests.support.waiting import eventually

NAMESPACE = "default"
IMAGE = "registry.k8s.io/pause:3.9"


@dataclass
class World:
    kind: str
    kubeconfig: Path
    admin: CoreV1
    nodes: list[str]
    sim: SimCluster | None = None
    role: KubeletRole | None = None  # the in-process role (simulator half only)
    real: RealCluster | None = None
    created: list[str] = field(default_factory=list)
    undo: list[tuple[str, KubeObject]] = field(default_factory=list)

    def name(self, base: str) -> str:
        return f"{base}-{uuid.uuid4().hex[:6]}"

    async def make_pod(self, base: str, **spec: Any) -> KubeObject:
        """Create a pod named ``base-<random>`` with ``spec`` merged into a one-container
        spec; deleted (grace 0) when the test ends."""
        name = self.name(base)
        self.created.append(name)
        body = {"metadata": {"name": name, "labels": {"test": "kubelet-role"}},
                "spec": {"containers": [{"name": "main", "image": IMAGE}],
                         "terminationGracePeriodSeconds": 30, **spec}}
        return await self.admin.create(PODS, body, namespace=NAMESPACE)

    async def pod(self, name: str) -> KubeObject | None:
        try:
            return await self.admin.get(PODS, name, namespace=NAMESPACE)
        except ApiNotFound:
            return None

    async def wait_pod(self, name: str, check: Callable[[KubeObject | None], bool], *,
                       what: str, limit_seconds: float = 30.0) -> KubeObject | None:
        """Poll the pod (another process changes it) until ``check`` holds."""
        seen: list[KubeObject | None] = [None]

        async def holds() -> bool:
            seen[0] = await self.pod(name)
            return check(seen[0])

        try:
            await eventually(holds, limit_seconds=limit_seconds, every=0.05, what=what)
        except TimeoutError:
            raise AssertionError(f"{name}: {what} not reached within {limit_seconds}s; "
                                 f"last seen: {seen[0]}") from None
        return seen[0]

    async def edit_node(self, name: str, spec: KubeObject) -> None:
        """Merge ``spec`` into a node's spec; the previous values come back at the end."""
        node = await self.admin.get(NODES, name)
        before = node.get("spec") or {}
        self.undo.append((name, {k: before.get(k) for k in spec}))
        await self.admin.patch(NODES, name, {"spec": spec}, patch_type=MERGE)

    async def restore_node(self, name: str) -> None:
        """Undo this test's :meth:`edit_node` of ``name`` now (latest first)."""
        for node, spec in reversed([u for u in self.undo if u[0] == name]):
            await self.admin.patch(NODES, node, {"spec": spec}, patch_type=MERGE)
        self.undo = [u for u in self.undo if u[0] != name]

    async def cleanup(self) -> None:
        for node in sorted({n for n, _ in self.undo}):
            await self.restore_node(node)
        for name in self.created:
            with contextlib.suppress(ApiNotFound):
                await self.admin.delete(PODS, name, namespace=NAMESPACE,
                                        grace_period_seconds=0)


async def admin_client(kubeconfig: Path) -> CoreV1:
    loaded = await load_configuration(kubeconfig=str(kubeconfig))
    return CoreV1(KubeClient(ApiClient(loaded.configuration), request_timeout=30))


def role_options(**overrides: Any) -> RoleOptions:
    base: dict[str, Any] = {"nodes": NODE_NAMES, "backoff_initial": 0.05,
                            "backoff_max": 0.5, "ready_timeout": 20.0}
    return RoleOptions(**{**base, **overrides})


@contextlib.asynccontextmanager
async def open_world(kind: str, tmp_path: Path, real: RealCluster | None,
                     ) -> AsyncIterator[World]:
    if kind == "sim":
        async with SimCluster(nodes=list(NODE_NAMES), kubelets=False) as sim:
            kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
            role_api = await admin_client(kubeconfig)
            role = KubeletRole(role_api, role_options())
            admin = await admin_client(kubeconfig)
            world = World(kind, kubeconfig, admin, list(NODE_NAMES), sim=sim, role=role)
            try:
                await role.start()
                yield world
            finally:
                await world.cleanup()
                await role.stop()
                await role_api.client.close()
                await admin.client.close()
        return
    assert real is not None
    admin = await admin_client(real.kubeconfig)
    world = World(kind, real.kubeconfig, admin, list(real.nodes), real=real)
    try:
        yield world
    finally:
        await world.cleanup()
        await admin.client.close()
