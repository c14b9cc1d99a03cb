"""The calls the driver makes: paths, query parameters and bodies, nothing more.

:class:`CoreV1` turns "get pod ns/name", "patch it (strategic merge)", "delete it with a
UID precondition and a grace period", "list nodes page by page", "watch pods from
resourceVersion N with bookmarks" into :class:`~drivers.kube.client.KubeClient` requests.
Patches of core kinds are strategic merge patches unless told otherwise; custom resources
take JSON merge patches (the server refuses a strategic one for them).

Called by the watch cache, the observer and the action handlers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from urllib.parse import quote

from drivers.kube.client import KubeClient, KubeObject

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Kind:
    """A resource: its plural (the path segment), whether it is namespaced, and the
    group/version prefix of its path (core/v1 unless told: custom resources are
    ``/apis/<group>/<version>``)."""

    plural: str
    namespaced: bool
    api: str = "/api/v1"


PODS = Kind("pods", namespaced=True)
NODES = Kind("nodes", namespaced=False)
EVENTS = Kind("events", namespaced=True)
NAMESPACES = Kind("namespaces", namespaced=False)


def path(kind: Kind, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    """``<api>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]``; no namespace: all of them."""
    parts = [kind.api]
    if kind.namespaced and namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(kind.plural)
    if name is not None:
        parts.append(quote(name, safe=""))
        if subresource is not None:
            parts.append(subresource)
    return "/".join(parts)


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


class CoreV1:
    """Typed-enough core/v1 operations over one :class:`KubeClient`."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> KubeObject:
        return await self.client.request("get", "GET", path(kind, namespace, name),
                                         resource=kind.plural, namespace=namespace)

    async def list_page(self, kind: Kind, *, namespace: str | None = None,
                        label_selector: str | None = None, field_selector: str | None = None,
                        limit: int | None = None, continue_: str | None = None) -> KubeObject:
        query = _selectors(label_selector, field_selector)
        if limit:
            query.append(("limit", str(limit)))
        if continue_:
            query.append(("continue", continue_))
        return await self.client.request("list", "GET", path(kind, namespace),
                                         resource=kind.plural, namespace=namespace, query=query)

    async def list_all(self, kind: Kind, *, namespace: str | None = None,
                       label_selector: str | None = None, field_selector: str | None = None,
                       page_size: int = 500) -> tuple[list[KubeObject], str]:
        """Every matching object (page by page) and the list's resourceVersion."""
        items: list[KubeObject] = []
        token: str | None = None
        version = ""
        while True:
            page = await self.list_page(kind, namespace=namespace, label_selector=label_selector,
                                        field_selector=field_selector, limit=page_size,
                                        continue_=token)
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                return items, version

    def watch(self, kind: Kind, *, namespace: str | None = None, resource_version: str = "",
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 290, bookmarks: bool = True,
              ) -> AbstractAsyncContextManager[AsyncIterator[KubeObject]]:
        """Watch from ``resource_version``; the server ends it after ``timeout_seconds``."""
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_seconds)),
                 *_selectors(label_selector, field_selector)]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        return self.client.stream(path(kind, namespace), resource=kind.plural, query=query,
                                  idle_timeout=timeout_seconds + 30.0, namespace=namespace)

    async def create(self, kind: Kind, body: KubeObject, *,
                     namespace: str | None = None) -> KubeObject:
        return await self.client.request("create", "POST", path(kind, namespace),
                                         resource=kind.plural, namespace=namespace, body=body)

    async def patch(self, kind: Kind, name: str, body: object, *, namespace: str | None = None,
                    patch_type: str = STRATEGIC_MERGE,
                    subresource: str | None = None) -> KubeObject:
        return await self.client.request("patch", "PATCH",
                                         path(kind, namespace, name, subresource),
                                         resource=kind.plural, namespace=namespace,
                                         body=body, content_type=patch_type)

    async def delete(self, kind: Kind, name: str, *, namespace: str | None = None,
                     uid: str | None = None, grace_period_seconds: int | None = None,
                     ) -> KubeObject:
        """DELETE with ``DeleteOptions``: ``preconditions.uid`` and ``gracePeriodSeconds``."""
        options: KubeObject = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        return await self.client.request("delete", "DELETE", path(kind, namespace, name),
                                         resource=kind.plural, namespace=namespace,
                                         body=options)
