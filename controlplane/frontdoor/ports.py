"""What the front door needs from the API server, as a port the composition root fills.

:class:`ResourceApi` lists, watches, reads and patches the custom resources of
``checkpoint.controlplane.dev`` (``drivers.kube.custom`` implements it over the real API
server; tests may pass a fake). Kinds are named by their ``kind`` (``Migration``), objects
travel as parsed JSON. Failures the front door reacts to are typed here, so it never
imports a driver: :class:`StaleResource` (409, or gone: read again),
:class:`WatchExpired` (410: list again); anything else is a ``ControlPlaneError`` to log
and retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from controlplane.errors import ControlPlaneError

Resource = dict[str, Any]


class StaleResource(ControlPlaneError):
    """The resource changed since it was read (409 on a precondition), or it is gone."""


class WatchExpired(ControlPlaneError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class ResourceApi(Protocol):
    """The custom resources over the API server."""

    async def served(self) -> bool:
        """Whether the API server serves the group (the CRDs are installed)."""
        ...

    async def list(self, kind: str) -> tuple[list[Resource], str]:
        """Every resource of ``kind`` in every namespace, and the list's resourceVersion."""
        ...

    def watch(self, kind: str, resource_version: str,
              ) -> AbstractAsyncContextManager[AsyncIterator[Resource]]:
        """Watch events (``type``, ``object``) of ``kind`` from ``resource_version``."""
        ...

    async def get(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        """The resource as the API server has it now (``None``: it does not exist)."""
        ...

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Resource, *,
                    status: bool = False) -> Resource:
        """A JSON merge patch of the resource (``status``: of its status subresource)."""
        ...
