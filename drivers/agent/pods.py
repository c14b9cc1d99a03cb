"""The agent's view of the cluster: the pods bound to its node, and UID-guarded patches.

:class:`NodePods` is the Kubernetes driver's :class:`~drivers.kube.cache.WatchCache`
(list + watch with bookmarks, relist on 410, resync, backoff) over pods with the field
selector ``spec.nodeName=<node>`` — each agent watches only its own node's pods, as a
DaemonSet must to scale. Every change calls the agent's hook.

:class:`PodPatcher` writes annotations with the driver's UID-carrying strategic merge
patch: a pod recreated under the same name (422 on ``metadata.uid``) or gone (404) is
never written to, and the call says so (``False``). Other failures raise the driver's
typed errors. Used by :mod:`drivers.agent.agent` and the sim dumper.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager

from drivers.kube import bodies
from drivers.kube.cache import ChangeHook, WatchCache
from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings
from drivers.kube.errors import ApiNotFound, KubeApiError
from drivers.kube.handlers import uid_mismatch
from drivers.kube.resources import PODS, CoreV1, Kind


class NodeScopedCoreV1(CoreV1):
    """core/v1 whose pod lists and watches only see pods bound to ``node``."""

    def __init__(self, client: KubeClient, node: str) -> None:
        super().__init__(client)
        self.field_selector = f"spec.nodeName={node}"

    def _scoped(self, kind: Kind, field_selector: str | None) -> str | None:
        if kind != PODS:
            return field_selector
        return ",".join(s for s in (field_selector, self.field_selector) if s)

    async def list_all(self, kind: Kind, *, namespace: str | None = None,
                       label_selector: str | None = None, field_selector: str | None = None,
                       page_size: int = 500) -> tuple[list[KubeObject], str]:
        return await super().list_all(kind, namespace=namespace, label_selector=label_selector,
                                      field_selector=self._scoped(kind, field_selector),
                                      page_size=page_size)

    def watch(self, kind: Kind, *, namespace: str | None = None, resource_version: str = "",
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 290, bookmarks: bool = True,
              ) -> AbstractAsyncContextManager[AsyncIterator[KubeObject]]:
        return super().watch(kind, namespace=namespace, resource_version=resource_version,
                             label_selector=label_selector,
                             field_selector=self._scoped(kind, field_selector),
                             timeout_seconds=timeout_seconds, bookmarks=bookmarks)


class NodePods:
    """A watch cache of the pods on one node."""

    def __init__(self, client: KubeClient, node: str, *, settings: KubeSettings,
                 on_change: ChangeHook) -> None:
        self.node = node
        self.api = NodeScopedCoreV1(client, node)
        self.cache = WatchCache(self.api, PODS, settings=settings, namespace=settings.namespace,
                                on_change=on_change)
        self.settings = settings

    async def start(self) -> None:
        self.cache.start()
        await self.cache.wait_synced(limit_seconds=self.settings.sync_timeout)

    async def stop(self) -> None:
        await self.cache.stop()

    def get(self, key: str) -> KubeObject | None:
        return self.cache.get(key)

    def all(self) -> list[KubeObject]:
        return list(self.cache)


class PodPatcher:
    """Annotation patches that only ever touch the pod with the given UID.

    A retryable failure (429, 5xx, a timeout, a conflict) is retried a few times with
    backoff before it is raised: one throttled or failed patch must not fail a whole
    capture or restore (the fault campaign saw a 2-4 % API error rate fail a quarter of
    the migrations). The patch is idempotent, so a retry after a lost answer is safe."""

    def __init__(self, api: CoreV1, *, attempts: int = 5, backoff: float = 0.05,
                 backoff_max: float = 2.0) -> None:
        self.api = api
        self.attempts, self.backoff, self.backoff_max = attempts, backoff, backoff_max

    async def annotate(self, namespace: str, name: str, uid: str,
                       changes: Mapping[str, str | None]) -> bool:
        """Set (``str``) or remove (``None``) annotations; ``False`` if the pod is not there."""
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                await self.api.patch(PODS, name, bodies.annotation_patch(uid, changes),
                                     namespace=namespace)
            except ApiNotFound:
                return False
            except KubeApiError as exc:
                if uid_mismatch(exc):
                    return False
                if not exc.retryable or attempt == self.attempts:
                    raise
                await asyncio.sleep(min(max(delay, exc.retry_after or 0), self.backoff_max))
                delay *= 2
                continue
            return True
        raise AssertionError("unreachable")  # pragma: no cover
