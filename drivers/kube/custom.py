"""The custom resources of ``checkpoint.controlplane.dev/v1alpha1`` over the API server:
the front door's :class:`~controlplane.frontdoor.ports.ResourceApi`.

Paths are :mod:`drivers.kube.resources`' with the group's prefix; patches are JSON merge
patches (``application/merge-patch+json``: the server takes no strategic merge patch for a
custom resource), the status through its subresource. A 409 and a 404 on a patch become
``StaleResource`` (read again), a 410 on a watch ``WatchExpired`` (list again).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from controlplane.frontdoor.ports import Resource, StaleResource, WatchExpired
from drivers.kube.client import KubeClient
from drivers.kube.errors import ApiConflict, ApiGone, ApiNotFound
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

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.api = CoreV1(client)

    async def served(self) -> bool:
        try:
            await self.client.request("get", "GET", API, resource=GROUP)
        except ApiNotFound:
            return False
        return True

    async def list(self, kind: str) -> tuple[list[Resource], str]:
        return await self.api.list_all(KINDS[kind])

    @contextlib.asynccontextmanager
    async def watch(self, kind: str,
                    resource_version: str) -> AsyncIterator[AsyncIterator[Resource]]:
        try:
            async with self.api.watch(KINDS[kind], resource_version=resource_version) as events:
                yield _expiring(events)
        except ApiGone as exc:
            raise WatchExpired(f"watch {KINDS[kind].plural}: {exc}") from exc

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


async def _expiring(events: AsyncIterator[Resource]) -> AsyncIterator[Resource]:
    """The watch's events; an ERROR event carrying 410 ends it as ``WatchExpired``."""
    async for event in events:
        if event.get("type") == "ERROR":
            status = event.get("object") or {}
            if status.get("code") == 410:
                raise WatchExpired(str(status.get("message") or "watch expired"))
            raise WatchExpired(f"watch error: {status.get('message') or status}")
        yield event
