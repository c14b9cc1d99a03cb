"""The custom resources of ``checkpoint.controlplane.dev/v1alpha1`` over the API server:
the front door's :class:`~controlplane.frontdoor.ports.ResourceApi`.

Paths are :mod:`drivers.kube.resources`' with the group's prefix; patches are JSON merge
patches (``application/merge-patch+json``: the server takes no strategic merge patch for a
custom resource), the status through its subresource. A 409 and a 404 on a patch become
``StaleResource`` (read again). :meth:`CustomResources.informer` is the driver's
:class:`~drivers.kube.cache.WatchCache` over a kind of the group: list, then watch with
bookmarks, resume from the last resourceVersion, exponential backoff after errors, relist
and diff after a 410 and every ``resync_seconds`` (``KubeSettings``). Built by
:mod:`controlplane.wiring.cluster`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from controlplane.frontdoor.ports import ChangeHook, Resource, StaleResource
from drivers.kube.cache import WatchCache
from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings
from drivers.kube.errors import ApiConflict, ApiNotFound
from drivers.kube.resources import MERGE, CoreV1, Kind

GROUP = "checkpoint.controlplane.dev"
VERSION = "v1alpha1"
API = f"/apis/{GROUP}/{VERSION}"

#: Every kind of the group, by its ``kind``.
KINDS = {
    "Checkpoint": Kind("checkpoints", namespaced=True, api=API),
    "Restore": Kind("restores", namespaced=True, api=API),
    "Migration": Kind("migrations", namespaced=True, api=API),
    "Suspension": Kind("suspensions", namespaced=True, api=API),
    "Drain": Kind("drains", namespaced=False, api=API),
    "CheckpointClass": Kind("checkpointclasses", namespaced=False, api=API),
}


class CustomResources:
    """The group's resources over one :class:`KubeClient` (see the module docstring)."""

    def __init__(self, client: KubeClient, *, settings: KubeSettings | None = None) -> None:
        self.client = client
        self.api = CoreV1(client)
        self.settings = settings or KubeSettings()

    async def served(self) -> bool:
        try:
            await self.client.request("get", "GET", API, resource=GROUP)
        except ApiNotFound:
            return False
        return True

    @contextlib.asynccontextmanager
    async def informer(self, kind: str, on_change: ChangeHook) -> AsyncIterator[None]:
        """A watch cache of ``kind`` while entered; each change to ``on_change``, every
        object carrying its ``kind`` (a list's items may not)."""
        def changed(old: KubeObject | None, new: KubeObject | None) -> None:
            on_change(_kinded(old, kind), _kinded(new, kind))
        cache = WatchCache(self.api, KINDS[kind], settings=self.settings, on_change=changed)
        cache.start()
        try:
            yield
        finally:
            await cache.stop()

    async def get(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        try:
            return await self.api.get(KINDS[kind], name, namespace=namespace)
        except ApiNotFound:
            return None

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Resource, *,
                    status: bool = False) -> Resource:
        try:
            return await self.api.patch(KINDS[kind], name, patch, namespace=namespace,
                                        patch_type=MERGE,
                                        subresource="status" if status else None)
        except (ApiConflict, ApiNotFound) as exc:
            raise StaleResource(str(exc)) from exc


def _kinded(obj: KubeObject | None, kind: str) -> Resource | None:
    if obj is None or obj.get("kind"):
        return obj
    return {**obj, "kind": kind}
