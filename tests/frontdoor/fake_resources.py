"""An in-memory ``ResourceApi`` that keeps the API server's rules the front door relies on:
UIDs, a resourceVersion per write (a merge patch carrying a stale one is a 409), a
generation bumped by spec changes only, the status written only through the status
subresource, finalizers holding a delete, and an informer reporting every change (from
a task of its own, as a real watch's events arrive apart from the replies).

The real server is the judge (tests/frontdoor/test_front_door_real.py); this fake makes
the door's logic quick to test on both database backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

from controlplane.frontdoor.ports import ChangeHook, Resource, StaleResource
from drivers.sim.patch import merge_patch

Key = tuple[str, str | None, str]


class FakeResources:
    def __init__(self) -> None:
        self.objects: dict[Key, Resource] = {}
        self.version = 0
        self.watchers: list[tuple[str, asyncio.Queue[Resource]]] = []
        self.status_writes = 0

    def _bump(self, obj: Resource) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _notify(self, kind: str, type_: str, obj: Resource) -> None:
        for watched, queue in self.watchers:
            if watched == kind:
                queue.put_nowait({"type": type_, "object": copy.deepcopy(obj)})

    # -- what a user does ---------------------------------------------------------------

    def create(self, kind: str, name: str, spec: dict[str, Any],
               namespace: str | None = "default") -> Resource:
        meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4()), "generation": 1}
        if namespace is not None:
            meta["namespace"] = namespace
        obj: Resource = {"apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": kind,
                         "metadata": meta, "spec": spec}
        self._bump(obj)
        self.objects[(kind, namespace, name)] = obj
        self._notify(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    def update_spec(self, kind: str, name: str, spec: dict[str, Any],
                    namespace: str | None = "default") -> None:
        obj = self.objects[(kind, namespace, name)]
        obj["spec"] = merge_patch(obj["spec"], spec)
        obj["metadata"]["generation"] += 1
        self._bump(obj)
        self._notify(kind, "MODIFIED", obj)

    def delete(self, kind: str, name: str, namespace: str | None = "default") -> None:
        key = (kind, namespace, name)
        obj = self.objects[key]
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
            self._bump(obj)
            self._notify(kind, "MODIFIED", obj)
        else:
            del self.objects[key]
            self._notify(kind, "DELETED", obj)

    def edit_status(self, kind: str, name: str, status: dict[str, Any] | None,
                    namespace: str | None = "default") -> None:
        obj = self.objects[(kind, namespace, name)]
        obj["status"] = status
        self._bump(obj)
        self._notify(kind, "MODIFIED", obj)

    async def delivered(self) -> None:
        """Until every open watch has handled every event sent to it."""
        await asyncio.gather(*(events.join() for _, events in self.watchers))

    def read(self, kind: str, name: str, namespace: str | None = "default") -> Resource | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    # -- the ResourceApi ----------------------------------------------------------------

    async def served(self) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def informer(self, kind: str, on_change: ChangeHook) -> AsyncIterator[None]:
        queue: asyncio.Queue[Resource] = asyncio.Queue()
        known: dict[Key, Resource] = {}
        for key, obj in list(self.objects.items()):
            if key[0] == kind:
                known[key] = copy.deepcopy(obj)
                on_change(None, copy.deepcopy(obj))
        entry = (kind, queue)
        self.watchers.append(entry)

        async def pump() -> None:
            while True:
                event = await queue.get()
                obj = event["object"]
                meta = obj["metadata"]
                key = (kind, meta.get("namespace"), meta["name"])
                old = known.get(key)
                if event["type"] == "DELETED":
                    known.pop(key, None)
                    on_change(old or obj, None)
                else:
                    known[key] = obj
                    on_change(old, obj)
                queue.task_done()
        task = asyncio.create_task(pump())
        try:
            yield
        finally:
            self.watchers.remove(entry)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def get(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        return self.read(kind, name, namespace)

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Resource, *,
                    status: bool = False) -> Resource:
        key = (kind, namespace, name)
        obj = self.objects.get(key)
        if obj is None:
            raise StaleResource(f"{kind} {name} not found")
        wanted = ((patch.get("metadata") or {}).get("resourceVersion"))
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise StaleResource(f"{kind} {name}: the object has been modified")
        if status:
            obj["status"] = merge_patch(obj.get("status"), patch.get("status"))
            self.status_writes += 1
        else:
            meta = {k: v for k, v in (patch.get("metadata") or {}).items()
                    if k != "resourceVersion"}
            obj["metadata"] = merge_patch(obj["metadata"], meta)
        self._bump(obj)
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.objects[key]
            self._notify(kind, "DELETED", obj)
        else:
            self._notify(kind, "MODIFIED", obj)
        return copy.deepcopy(obj)
