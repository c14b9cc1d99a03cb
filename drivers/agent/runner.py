"""Wiring one node agent to a cluster: the node's pod watch feeding :class:`NodeAgent`.

::

    kube = await KubeDriver.connect(kubeconfig=path)        # only its client is used
    async with node_agent(client=kube.client, settings=AgentSettings("node-1", workdir),
                          registry=OciLayout(root), dumper=SimDumper) as agent:
        ...                                                  # serves until the block ends

The pod watch (:class:`~drivers.agent.pods.NodePods`) lists the node's pods, then
watches them; every change reaches :meth:`NodeAgent.on_change`. Leaving the block stops
the watch and cancels the jobs in flight (their requests stay on the pods, for the next
agent to take). With ``handoff`` (the agents' shared key) the agent's handoff server
listens while the agent serves, and closes after its jobs ended. Before it watches, the
work directory is made private (0700) and the job directories a killed agent left
(plain-text dumps) are removed. Used by
``python -m drivers.agent`` and the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from controlplane.clock import Clock
from controlplane.logs import get_logger
from drivers.agent.agent import AgentSettings, NodeAgent, prepare_workdir
from drivers.agent.dumper import Dumper
from drivers.agent.handoff import HandoffServer
from drivers.agent.handoffs import Handoff, HandoffSettings
from drivers.agent.pods import NodePods, PodPatcher
from drivers.agent.sealing import Sealing
from drivers.kube.client import KubeClient
from drivers.kube.config import KubeSettings
from drivers.kube.resources import CoreV1
from drivers.registry.port import Registry

log = get_logger("drivers.agent")
DumperFactory = Callable[[PodPatcher], Dumper]


@contextlib.asynccontextmanager
async def node_agent(*, client: KubeClient, settings: AgentSettings, registry: Registry,
                     dumper: DumperFactory, kube: KubeSettings | None = None,
                     clock: Clock | None = None,
                     sealing: Sealing | None = None,
                     handoff: HandoffSettings | None = None) -> AsyncIterator[NodeAgent]:
    left = await asyncio.to_thread(prepare_workdir, settings.workdir)
    if left:
        log.warning("removed job directories a stopped agent left behind", count=left,
                    workdir=str(settings.workdir))
    async with contextlib.AsyncExitStack() as stack:
        server = None
        if handoff is not None:
            server = await stack.enter_async_context(HandoffServer(
                handoff.key, handoff.host, handoff.port,
                max_wait=max(settings.restore_timeout, settings.capture_timeout)))
        patcher = PodPatcher(CoreV1(client))
        agent = NodeAgent(settings, patcher=patcher, registry=registry,
                          dumper=dumper(patcher), clock=clock, sealing=sealing,
                          handoff=Handoff(handoff, server) if handoff and server else None)
        pods = NodePods(client, settings.node, settings=kube or KubeSettings(),
                        on_change=agent.on_change)
        try:
            await pods.start()
            yield agent
        finally:
            await pods.stop()
            await agent.stop()
