"""Regression tests for bugs the reliability campaigns found (each names its campaign)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from sqlalchemy.exc import DBAPIError

from controlplane.engine.observation import Interests, PodView
from controlplane.store.database import Database
from controlplane.store.errors import DatabaseUnavailable
from controlplane.store.session import translate_errors
from drivers.agent.pods import PodPatcher
from drivers.kube.cache import WatchCache
from drivers.kube.errors import (
    ApiConflict,
    ApiForbidden,
    ApiNotFound,
    ApiServerError,
    ApiTooManyRequests,
)
from drivers.kube.observer import KubeObserver
from drivers.kube.resources import NODES, PODS, CoreV1, Kind


@dataclass
class StaleCache:
    """A synced cache that holds what a relist returned: a snapshot older than the server."""

    kind: Kind
    resource_version: str
    objects: dict[str, Any] = field(default_factory=dict)
    synced: bool = True
    label_selector: str | None = None

    def covers(self, namespace: str | None) -> bool:
        return True

    def get(self, key: str) -> Any:
        return self.objects.get(key)


@dataclass
class Server:
    pods: dict[str, Any]
    gets: int = 0

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> Any:
        self.gets += 1
        found = self.pods.get(f"{namespace}/{name}")
        if found is None:
            raise ApiNotFound(f"pods {name!r} not found")
        return found


def _pod(rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": "app-r1", "uid": "u-1",
                         "resourceVersion": rv},
            "spec": {"nodeName": "node-1"}, "status": {"phase": "Pending"}}


async def test_a_relist_older_than_a_read_through_does_not_make_a_pod_vanish() -> None:
    """Fault campaign, seed 0: a restore attempt was judged ``RestoredPodVanished`` (and
    its cleanup "nothing to delete") while the pod ran on; the rollback restored a second
    copy — one workload, two Running pods. Cause: the pods cache relisted after a 410;
    the LIST was answered before the pod was created but applied after the observer had
    read the pod through (cache not synced at that moment). The cache then said "synced"
    and "absent". Now a cache's absence is never trusted: the pod is read through."""
    server = Server({"default/app-r1": _pod("15")})
    pods = StaleCache(PODS, "10")
    observer = KubeObserver(cast(CoreV1, server), pods=cast(WatchCache, pods),
                            nodes=cast(WatchCache, StaleCache(NODES, "10")))
    pods.synced = False  # recovering from the 410: the observer reads through
    first = await observer.pod("default/app-r1")
    assert isinstance(first, PodView)
    pods.synced = True  # the older relist lands: synced, at version 10, without the pod
    again = await observer.pod("default/app-r1")
    assert isinstance(again, PodView), "an older snapshot must not turn a seen pod absent"
    assert server.gets == 2


async def test_a_pod_another_workers_cache_saw_is_not_absent_in_a_lagging_cache() -> None:
    """Fault campaign, seed 0, in CI (3 workers, API latency injected): attempt 1 of a
    restore was judged ``RestoredPodVanished`` while it ran on node-2, its cleanup found
    "nothing to delete", and the workload ended on two Running pods (w020, node-2 and
    node-3). One worker recorded the pod's UID from its cache; the next lease went to a
    worker whose cache was synced (its watch healthy) but had not yet received the pod's
    ADDED event. The per-process guard of the relist bug above could not see that. Now
    any absence is confirmed by the API server, and only a 404 is "absent"."""
    server = Server({"default/app-r1": _pod("15")})
    lagging = StaleCache(PODS, "12")  # synced, healthy, three versions behind
    observer = KubeObserver(cast(CoreV1, server), pods=cast(WatchCache, lagging),
                            nodes=cast(WatchCache, StaleCache(NODES, "12")))
    seen = await observer.observe(Interests(pods=frozenset({"default/app-r1"})))
    assert isinstance(seen.pods["default/app-r1"], PodView)
    assert server.gets == 1
    del server.pods["default/app-r1"]
    assert await observer.pod("default/app-r1") is None  # the 404: really gone
    assert server.gets == 2


class _Db:
    display_url = "postgresql+asyncpg://postgres@127.0.0.1:5432/cp"


class _PgError(Exception):
    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("sqlstate", "message"), [
    ("57P03", "the database system is shutting down"),
    ("57P03", "the database system is starting up"),
    ("57P01", "terminating connection due to administrator command"),
    ("08006", "connection failure"),
    ("53300", "sorry, too many clients already"),
])
async def test_a_server_going_away_is_database_unavailable_not_a_crash(
        sqlstate: str, message: str) -> None:
    """Database-restart test: a ``cpctl worker`` died with exit 70 ("internal error:
    DBAPIError: the database system is shutting down") when PostgreSQL was stopped:
    asyncpg reports these SQLSTATEs as plain DBAPIErrors, which the store re-raised as
    bugs. They are now ``DatabaseUnavailable``, on which the worker backs off."""
    with pytest.raises(DatabaseUnavailable, match=message):
        async with translate_errors(cast(Database, _Db())):
            raise DBAPIError("SELECT 1", {}, _PgError(message, sqlstate))


async def test_a_bad_statement_is_still_surfaced_as_a_bug() -> None:
    with pytest.raises(DBAPIError, match="syntax error"):
        async with translate_errors(cast(Database, _Db())):
            raise DBAPIError("SELEC 1", {}, _PgError("syntax error at or near", "42601"))


@dataclass
class FlakyApi:
    failures: list[Exception]
    patches: int = 0

    async def patch(self, kind: Kind, name: str, body: Any, *,
                    namespace: str | None = None) -> Any:
        self.patches += 1
        if self.failures:
            raise self.failures.pop(0)
        return {}


async def test_the_agent_retries_a_throttled_or_failed_annotation_patch() -> None:
    """Fault campaign, seed 0: 21 of 80 migrations failed because the node agent's report
    patch met one injected 429/500/409 and gave the whole capture or restore up. The
    patcher now retries retryable failures (idempotent patch) before raising."""
    api = FlakyApi([ApiTooManyRequests("throttled", retry_after=0.0),
                    ApiServerError("boom"), ApiConflict("modified")])
    patcher = PodPatcher(cast(CoreV1, api), backoff=0.001)
    assert await patcher.annotate("default", "app", "u-1", {"k": "v"}) is True
    assert api.patches == 4


async def test_the_agent_does_not_retry_a_refusal() -> None:
    api = FlakyApi([ApiForbidden("forbidden")])
    with pytest.raises(ApiForbidden):
        await PodPatcher(cast(CoreV1, api), backoff=0.001).annotate(
            "default", "app", "u-1", {"k": "v"})
    assert api.patches == 1


async def test_the_agent_gives_up_after_its_attempts() -> None:
    api = FlakyApi([ApiServerError("boom") for _ in range(10)])
    with pytest.raises(ApiServerError):
        await PodPatcher(cast(CoreV1, api), attempts=3, backoff=0.001).annotate(
            "default", "app", "u-1", {"k": "v"})
    assert api.patches == 3
