"""The Kubernetes driver assembled: config -> client -> caches, observer, handlers, wakes.

::

    async with await KubeDriver.connect(kubeconfig=path, on_pod_change=wake) as kube:
        worker = Worker(db, kinds, kube.observer, ActionRunner(kube.handlers(), policy), ...)
        ...
        kube.requests.snapshot()   # API requests by verb

:meth:`KubeDriver.connect` loads kubeconfig or in-cluster config
(:mod:`drivers.kube.config`), builds the rate-limited, counted
:class:`~drivers.kube.client.KubeClient`; :meth:`KubeDriver.start` runs a pod cache and a
node cache (:mod:`drivers.kube.cache`) and waits for their first sync. Every pod change
the pod cache sees calls ``on_pod_change(uid)`` through a :class:`~drivers.kube.wakes.
WakeDispatcher` (the engine passes a closure over ``store.leases.wake_by_keys``): machines
are woken by the watch, never by polling the API server per machine.

Called by the control plane's composition root (CLI worker, demo, benchmarks) and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import refresh_token
from kubernetes_asyncio.config.kube_config import KubeConfigLoader

from controlplane.clock import Clock
from controlplane.worker.ports import ActionHandler
from drivers.kube.cache import WatchCache
from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings, load_configuration
from drivers.kube.handlers import NodeActions, PodActions
from drivers.kube.metrics import RequestCounter
from drivers.kube.observer import KubeObserver, ReadThroughObserver
from drivers.kube.ratelimit import TokenBucket
from drivers.kube.resources import NODES, PODS, CoreV1
from drivers.kube.wakes import PodChangeCallback, PodChangesCallback, WakeDispatcher

USER_AGENT = "checkpoint-controlplane/0.1 (kubernetes_asyncio)"


class KubeDriver:
    """One cluster connection: watch caches, the observer, the action handlers."""

    def __init__(self, client: KubeClient, *, settings: KubeSettings | None = None,
                 on_pod_change: PodChangeCallback | None = None, clock: Clock | None = None,
                 loader: KubeConfigLoader | None = None,
                 on_pod_changes: PodChangesCallback | None = None) -> None:
        self.settings = s = settings or KubeSettings()
        self.client = client
        self.api = CoreV1(client)
        self.wakes = (WakeDispatcher(on_pod_change, batch_callback=on_pod_changes)
                      if on_pod_change is not None or on_pod_changes is not None else None)
        self.pods = WatchCache(self.api, PODS, settings=s, namespace=s.namespace,
                               label_selector=s.pod_label_selector, on_change=self._pod_changed)
        self.nodes = WatchCache(self.api, NODES, settings=s)
        self.observer = KubeObserver(self.api, pods=self.pods, nodes=self.nodes)
        #: For submissions: reads the API server, never the (possibly lagging) cache.
        self.fresh_observer = ReadThroughObserver(self.observer)
        self.actions = PodActions(self.api, clock=clock,
                                  delete_grace_seconds=s.delete_grace_seconds,
                                  component=s.event_component)
        self._loader = loader
        self._refresh: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, *, kubeconfig: str | None = None, context: str | None = None,
                      in_cluster: bool | None = None, settings: KubeSettings | None = None,
                      on_pod_change: PodChangeCallback | None = None,
                      on_pod_changes: PodChangesCallback | None = None,
                      clock: Clock | None = None,
                      limiter: TokenBucket | None = None) -> KubeDriver:
        """Load the cluster config and build a driver (not started yet)."""
        s = settings or KubeSettings()
        loaded = await load_configuration(kubeconfig=kubeconfig, context=context,
                                          in_cluster=in_cluster)
        api = ApiClient(loaded.configuration)
        api.user_agent = USER_AGENT
        client = KubeClient(api,
                            limiter=limiter or TokenBucket(qps=s.qps, burst=s.burst),
                            counter=RequestCounter(), request_timeout=s.request_timeout,
                            connect_timeout=s.connect_timeout)
        return cls(client, settings=s, on_pod_change=on_pod_change, clock=clock,
                   loader=loaded.loader, on_pod_changes=on_pod_changes)

    @property
    def requests(self) -> RequestCounter:
        """API requests sent, by verb: ``requests.snapshot()`` / ``requests.since(...)``."""
        return self.client.counter

    def handlers(self) -> dict[str, ActionHandler]:
        """Action type -> handler, for the worker's ``ActionRunner``."""
        return {**self.actions.handlers(), **NodeActions(self.api).handlers()}

    async def start(self, *, wait: bool = True) -> None:
        """Start the caches (and wakes); with ``wait``, until both listed once."""
        if self._loader is not None and self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(
                refresh_token(self._loader, self.client.api.configuration),
                name="kube-token-refresh")
        if self.wakes is not None:
            self.wakes.start()
        self.pods.start()
        self.nodes.start()
        if wait:
            limit = self.settings.sync_timeout
            await self.pods.wait_synced(limit_seconds=limit)
            await self.nodes.wait_synced(limit_seconds=limit)

    async def close(self) -> None:
        await self.pods.stop()
        await self.nodes.stop()
        if self.wakes is not None:
            await self.wakes.stop()
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        await self.client.close()

    async def __aenter__(self) -> KubeDriver:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    def _pod_changed(self, old: KubeObject | None, new: KubeObject | None) -> None:
        if self.wakes is None:
            return
        for obj in (old, new):
            uid = ((obj or {}).get("metadata") or {}).get("uid")
            if uid:
                self.wakes.notify(str(uid))
