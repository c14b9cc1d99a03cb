"""Run the kubelet role against the cluster a kubeconfig names, until told to stop.

:func:`serve` loads the kubeconfig (:func:`drivers.kube.config.load_configuration`),
opens the project's :class:`~drivers.kube.client.KubeClient`, starts a
:class:`~drivers.kubelet.role.KubeletRole`, calls ``on_ready`` with the nodes and the
server's address once every node is Ready, and stops (watches closed, client closed)
when ``stop`` is set. Called by ``cpctl sim nodes`` (:mod:`controlplane.cli.sim`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kubernetes_asyncio.client import ApiClient

from controlplane.logs import get_logger
from drivers.kube.client import KubeClient
from drivers.kube.config import load_configuration
from drivers.kube.ratelimit import TokenBucket
from drivers.kube.resources import CoreV1
from drivers.kubelet.options import RoleOptions
from drivers.kubelet.podman_nodes import RuntimeNodes
from drivers.kubelet.role import KubeletRole

log = get_logger("drivers.kubelet")

Ready = Callable[[tuple[str, ...], str], None]


async def serve(options: RoleOptions, *, kubeconfig: str | None, context: str | None,
                on_ready: Ready, stop: asyncio.Event,
                runtime: RuntimeNodes | None = None) -> KubeletRole:
    """Run until ``stop`` is set; returns the stopped role (its ``stats``)."""
    options.check()
    loaded = await load_configuration(kubeconfig=kubeconfig, context=context)
    client = KubeClient(ApiClient(loaded.configuration),
                        limiter=TokenBucket(qps=100.0, burst=200), request_timeout=15.0)
    role = KubeletRole(CoreV1(client), options, runtime=runtime)
    try:
        starting = asyncio.ensure_future(role.start())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not starting.done():  # told to stop while registering: no ready line
                starting.cancel()
            stopping.cancel()
        if not starting.cancelled():
            starting.result()  # raises what registration met (RoleNotReady...)
            on_ready(options.nodes, client.host)
            await stop.wait()
    finally:
        await role.stop()
        await client.close()
    log.info("kubelet role stopped", **vars(role.stats))
    return role
