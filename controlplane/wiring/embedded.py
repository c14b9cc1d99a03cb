"""The embedded default: a simulated cluster, a node agent per node, an OCI layout on
disk, and the product (``wiring.product``) running against them, all in this process.

Used by ``cpctl demo``; a composition root (import-linter names its edges into drivers).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.clock import Clock
from controlplane.machines.submission import Limits
from controlplane.store.database import Database
from controlplane.wiring.product import Product, RunsProduct, product
from controlplane.worker.loop import WorkerConfig
from drivers.agent import AgentSettings, node_agent
from drivers.agent.sim import SimDumper
from drivers.registry import OciLayout
from drivers.sim import SimCluster

#: How artifacts in the on-disk layout are named (``registry/repo``), as in a real one.
REGISTRY_HOST = "localhost:5000"


@dataclass
class Embedded(RunsProduct):
    cluster: SimCluster
    product: Product

    def repository(self, name: str) -> str:
        return f"{REGISTRY_HOST}/{name}"


@contextlib.asynccontextmanager
async def embedded(db: Database, root: Path, clock: Clock, *,
                   nodes: int | Sequence[str] = 3,
                   limits: Limits | None = None) -> AsyncIterator[Embedded]:
    """Run the whole product in this process until the context exits.

    ``limits``: admission limits; the worker then also admits held operations, as
    ``cpctl worker`` does (needed by drains, whose children may be queued).
    """
    async with SimCluster(nodes=nodes) as cluster:
        kubeconfig = cluster.write_kubeconfig(root / "sim-kubeconfig.yaml")
        registry = OciLayout(root / "registry")
        config = WorkerConfig(worker_id="embedded", poll_seconds=0.05, settle_seconds=0.2,
                              limits=limits)
        async with product(db, clock, registry=registry, config=config,
                           kubeconfig=str(kubeconfig)) as running, \
                contextlib.AsyncExitStack() as agents:
            for node in cluster.node_names:
                await agents.enter_async_context(node_agent(
                    client=running.kube.client, registry=registry, dumper=SimDumper,
                    settings=AgentSettings(node, root / "agents" / node,
                                           capture_timeout=60, restore_timeout=60)))
            yield Embedded(cluster, running)
