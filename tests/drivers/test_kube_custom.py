"""The front door's informer over the group's resources is the driver's watch cache: it
reports each resource listed, each change, a deletion, every object carrying its ``kind``
(a list's items need not); after a ``410 Gone`` it relists and reports only what changed;
leaving it stops the watch. (The real API server judges the whole:
tests/frontdoor/test_front_door_real.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from drivers.kube.client import KubeClient, KubeObject
from drivers.kube.config import KubeSettings
from drivers.kube.custom import KINDS, CustomResources
from drivers.kube.resources import CoreV1, Kind


def _obj(name: str, version: str, uid: str = "") -> KubeObject:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid or name,
                         "resourceVersion": version}}


class Server:
    """``list_all``/``watch`` as the cache calls them: each watch plays one script."""

    def __init__(self, lists: list[list[KubeObject]], scripts: list[list[KubeObject]]
                 ) -> None:
        self.snapshots = lists
        self.scripts = scripts
        self.lists: list[Kind] = []
        self.watching = asyncio.Event()
        self.closed = asyncio.Event()

    async def list_all(self, kind: Kind, **_: Any) -> tuple[list[KubeObject], str]:
        self.lists.append(kind)
        return self.snapshots.pop(0), "10"

    @contextlib.asynccontextmanager
    async def watch(self, kind: Kind, **_: Any) -> AsyncIterator[AsyncIterator[KubeObject]]:
        script = self.scripts.pop(0) if self.scripts else []

        async def events() -> AsyncIterator[KubeObject]:
            for event in script:
                yield event
            self.watching.set()
            await asyncio.Event().wait()  # open until the cache stops
        try:
            yield events()
        finally:
            if not self.scripts:
                self.closed.set()


async def test_the_informer_reports_changes_with_their_kind_and_relists_after_410() -> None:
    server = Server([[_obj("a", "1"), _obj("b", "2")],
                     [_obj("a", "3"), _obj("b", "4")]], [  # the relist: b changed meanwhile
        [{"type": "MODIFIED", "object": _obj("a", "3")},
         {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
        [{"type": "DELETED", "object": _obj("a", "5")}],
    ])
    resources = CustomResources(cast(KubeClient, None),
                                settings=KubeSettings(backoff_initial=0.0))
    resources.api = cast(CoreV1, server)
    seen: list[tuple[str | None, str | None, str]] = []

    def changed(old: KubeObject | None, new: KubeObject | None) -> None:
        either = new or old or {}
        assert either["kind"] == "Migration"
        seen.append(((old or {}).get("metadata", {}).get("resourceVersion"),
                     (new or {}).get("metadata", {}).get("resourceVersion"),
                     either["metadata"]["name"]))

    async with resources.informer("Migration", changed):
        await server.watching.wait()
    await server.closed.wait()
    assert server.lists == [KINDS["Migration"]] * 2
    assert seen == [(None, "1", "a"), (None, "2", "b"),  # the first list
                    ("1", "3", "a"),  # the watch
                    ("2", "4", "b"),  # the relist after the 410: b only (a unchanged)
                    ("3", None, "a")]  # the deletion
