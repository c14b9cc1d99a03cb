"""The embedded default: a simulated cluster, a node agent per node, an OCI layout on
disk, and the product (``wiring.product``) running against them, all in this process.

Sealed as a fresh install is: keys generated under ``root/keys`` (0600, never logged),
every agent signing what it pushes and verifying what it restores, the worker pinning
only signed artifacts, and :meth:`Embedded.encryption` the block of a sealed class
(encrypted for ``recipient.pub``, unsealed with the ``recipient.pem`` file). The agents
share a handoff key (``keys/handoff.key``) and listen on loopback, so a migration whose
class asks for ``transfer: stream`` streams between them (docs/protocol.md, "Handoff").

Used by ``cpctl demo``; a composition root (import-linter names its edges into drivers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.clock import Clock
from controlplane.machines.submission import Limits
from controlplane.store.database import Database
from controlplane.wiring.product import Product, RunsProduct, product
from controlplane.worker.loop import WorkerConfig
from drivers.agent import AgentSettings, node_agent
from drivers.agent.handoffs import HandoffSettings, read_handoff_key
from drivers.agent.sealing import Sealing, SealingSettings
from drivers.agent.sim import SimDumper
from drivers.registry import OciLayout
from drivers.sealing.keys import generate_keypair
from drivers.sim import SimCluster

#: How artifacts in the on-disk layout are named (``registry/repo``), as in a real one.
REGISTRY_HOST = "localhost:5000"


@dataclass
class Embedded(RunsProduct):
    cluster: SimCluster
    product: Product
    keys: Path

    def repository(self, name: str) -> str:
        return f"{REGISTRY_HOST}/{name}"

    def encryption(self) -> dict[str, object]:
        """A class's ``encryption`` block for this world's recipient key."""
        return sealed_class(self.keys)


def sealed_class(keys: Path) -> dict[str, object]:
    """The ``encryption`` block sealing for ``keys/recipient.pub`` (:func:`make_keys`);
    absolute, as a class's key sources must be (``cpctl demo`` runs in ``var/demo``)."""
    keys = keys.resolve()
    return {"recipients": [f"file:{keys / 'recipient.pub'}"],
            "keyFile": str(keys / "recipient.pem")}


def make_keys(keys: Path) -> Sealing:
    """The agents' signing key and the sealed class's recipient, made once per root."""
    for name in ("signing", "recipient"):
        if not (keys / f"{name}.pem").exists():
            generate_keypair(keys / f"{name}.pem", keys / f"{name}.pub")
    return Sealing.load(SealingSettings(signing_key=keys / "signing.pem",
                                        trusted_keys=(keys / "signing.pub",)))


def make_handoff(keys: Path) -> HandoffSettings:
    """The agents' shared handoff key (``keys/handoff.key``, made once per root, as the
    ``checkpoint-handoff`` Secret is in a cluster); each agent listens on loopback."""
    path = keys / "handoff.key"
    if not path.exists():
        keys.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_bytes(os.urandom(32))
    return HandoffSettings(read_handoff_key(path))


@contextlib.asynccontextmanager
async def embedded(db: Database, root: Path, clock: Clock, *,
                   nodes: int | Sequence[str] = 3,
                   limits: Limits | None = None) -> AsyncIterator[Embedded]:
    """Run the whole product in this process until the context exits.

    ``limits``: admission limits; the worker then also admits held operations, as
    ``cpctl worker`` does (needed by drains, whose children may be queued).
    """
    keys = root / "keys"
    sealing = await asyncio.to_thread(make_keys, keys)
    handoff = await asyncio.to_thread(make_handoff, keys)
    trusted = [await asyncio.to_thread((keys / "signing.pub").read_bytes)]
    async with SimCluster(nodes=nodes) as cluster:
        kubeconfig = cluster.write_kubeconfig(root / "sim-kubeconfig.yaml")
        registry = OciLayout(root / "registry")
        config = WorkerConfig(worker_id="embedded", poll_seconds=0.05, settle_seconds=0.2,
                              limits=limits)
        async with product(db, clock, registry=registry, config=config,
                           kubeconfig=str(kubeconfig), trusted_keys=trusted) as running, \
                contextlib.AsyncExitStack() as agents:
            for node in cluster.node_names:
                await agents.enter_async_context(node_agent(
                    client=running.kube.client, registry=registry, dumper=SimDumper,
                    sealing=sealing, handoff=handoff,
                    settings=AgentSettings(node, root / "agents" / node,
                                           capture_timeout=60, restore_timeout=60)))
            yield Embedded(cluster, running, keys)
