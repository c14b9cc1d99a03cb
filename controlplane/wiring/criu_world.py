"""The real-runtime world: the product migrating real processes, all on this machine.

What ``cpctl demo --runtime criu`` runs, in this process but for the real parts: the
simulated API server without its in-process kubelets, the kubelet role with
runtime-backed nodes (each a podman root under ``root/nodes``), Debian's
``docker-registry`` on loopback (:func:`drivers.registry.local.local_registry`), a node
agent per node with the ``criu`` dumper, and the product (``wiring.product``) speaking
HTTP to that registry. The counter image (:mod:`drivers.podman.workload`) is built and
pushed first. Needs ``scripts/ensure-criu`` and ``scripts/ensure-registry``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.clock import Clock
from controlplane.store.database import Database
from controlplane.wiring.embedded import make_handoff, make_keys, sealed_class
from controlplane.wiring.product import Product, RunsProduct, product
from controlplane.worker.loop import WorkerConfig
from drivers.agent import AgentSettings, node_agent
from drivers.agent.criu import CriuDumper
from drivers.agent.pods import PodPatcher
from drivers.kube.resources import CoreV1
from drivers.kubelet.options import RoleOptions
from drivers.kubelet.podman_nodes import RuntimeNodes
from drivers.kubelet.role import KubeletRole
from drivers.podman import PodmanNode
from drivers.podman.workload import (
    Resumption,
    Tick,
    build_image,
    command,
    pod_ticks,
    resumption,
)
from drivers.registry.local import local_registry
from drivers.registry.options import registry_from_options
from drivers.sim import SimCluster

NODES = ("node-1", "node-2", "node-3")


@dataclass
class RuntimeWorld(RunsProduct):
    cluster: SimCluster
    product: Product
    registry_host: str
    image: str
    nodes: RuntimeNodes
    keys: Path

    def repository(self, name: str) -> str:
        return f"{self.registry_host}/{name}"

    def encryption(self) -> dict[str, object]:
        """A class's ``encryption`` block for this world's recipient key."""
        return sealed_class(self.keys)

    def resumption(self, ticks: list[Tick]) -> Resumption | None:
        return resumption(ticks)

    def create_counter(self, namespace: str, name: str, node: str, mib: int) -> None:
        self.cluster.create_pod(namespace, name, node=node, image=self.image,
                                command=command(mib))

    async def ticks(self, pod: dict[str, Any]) -> list[Tick]:
        """The counter's ticks as its container on its node logged them."""
        return await pod_ticks(self.nodes.nodes[pod["spec"]["nodeName"]], pod)


async def _reset(node: PodmanNode) -> None:
    with contextlib.suppress(Exception):
        await node.run("system", "reset", "--force")
    shutil.rmtree(node.runroot, ignore_errors=True)


@contextlib.asynccontextmanager
async def runtime_world(db: Database, root: Path, clock: Clock, *,
                        nodes: Sequence[str] = NODES,
                        lazy_runtime: bool = True) -> AsyncIterator[RuntimeWorld]:
    """``lazy_runtime``: the nodes' podman creates containers through the lazy-pages runc
    wrapper (they can then migrate lazily; docs/runtime.md says what it costs)."""
    runtime = RuntimeNodes.under(root / "nodes", nodes, lazy=lazy_runtime)
    builder = PodmanNode((root / "builder").resolve())
    sealing = await asyncio.to_thread(make_keys, root / "keys")  # signed, as installed
    handoff = await asyncio.to_thread(make_handoff, root / "keys")
    trusted = [await asyncio.to_thread((root / "keys" / "signing.pub").read_bytes)]
    try:
        async with local_registry(root / "registry") as host, \
                SimCluster(nodes=[], kubelets=False) as cluster:
            image = await build_image(builder, host, root / "image")
            kubeconfig = cluster.write_kubeconfig(root / "sim-kubeconfig.yaml")
            registry = registry_from_options(layout=None)
            config = WorkerConfig(worker_id="runtime", poll_seconds=0.05, settle_seconds=0.2)
            async with product(db, clock, registry=registry, config=config,
                               kubeconfig=str(kubeconfig), trusted_keys=trusted) as running, \
                    contextlib.AsyncExitStack() as stack:
                role = KubeletRole(CoreV1(running.kube.client), RoleOptions(nodes=tuple(nodes)),
                                   runtime=runtime)
                await role.start()
                stack.push_async_callback(role.stop)
                for node in nodes:
                    def dumper(patcher: PodPatcher, node: str = node) -> CriuDumper:
                        return CriuDumper(runtime.nodes[node])
                    await stack.enter_async_context(node_agent(
                        client=running.kube.client, registry=registry, dumper=dumper,
                        sealing=sealing, handoff=handoff,
                        settings=AgentSettings(node, root / "agents" / node,
                                               capture_timeout=120, restore_timeout=120)))
                yield RuntimeWorld(cluster, running, host, image, runtime, root / "keys")
            await registry.close()
    finally:
        for podman in [builder, *runtime.nodes.values()]:
            await _reset(podman)
