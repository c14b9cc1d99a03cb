"""Wiring one node agent to a cluster: the node's pod watch feeding :class:`NodeAgent`.

::

    kube = await KubeDriver.connect(kubeconfig=path)        # only its client is used
    async with node_agent(client=kube.client, settings=AgentSettings("node-1", workdir),
                          registry=OciLayout(root), dumper=SimDumper) as agent:
        ...                                                  # serves until the block ends

The pod watch (:class:`~drivers.agent.pods.NodePods`) lists the node's pods, then
watches them; every change reaches :meth:`NodeAgent.on_change`. Leaving the block stops
the watch and cancels the jobs in flight (their requests stay on the pods, for the next
agent to take). Used by ``python -m drivers.agent`` and the tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from controlplane.clock import Clock
from drivers.agent.agent import AgentSettings, NodeAgent
from drivers.agent.dumper import Dumper
from drivers.agent.pods import NodePods, PodPatcher
from drivers.kube.client import KubeClient
from drivers.kube.config import KubeSettings
from drivers.kube.resources import CoreV1
from drivers.registry.port import Registry

DumperFactory = Callable[[PodPatcher], Dumper]


@contextlib.asynccontextmanager
async def node_agent(*, client: KubeClient, settings: AgentSettings, registry: Registry,
                     dumper: DumperFactory, kube: KubeSettings | None = None,
                     clock: Clock | None = None) -> AsyncIterator[NodeAgent]:
    patcher = PodPatcher(CoreV1(client))
    agent = NodeAgent(settings, patcher=patcher, registry=registry, dumper=dumper(patcher),
                      clock=clock)
    pods = NodePods(client, settings.node, settings=kube or KubeSettings(),
                    on_change=agent.on_change)
    try:
        await pods.start()
        yield agent
    finally:
        await pods.stop()
        await agent.stop()
