"""The fault proxy in front of the session's real API server (envtest).

Invariants pinned: a request the faults leave alone reaches the real server unchanged
and its answer comes back unchanged; an injected failure never reaches it and is the
simulator's ``Status``, which the driver types as it types the real server's; a proxied
watch is relayed event by event, and ``expire_watches()`` ends it with the real server's
``ERROR 410`` so the driver relists, while an ended, cut or randomly dropped one is
resumed without a relist; ``compact()`` compacts the real etcd, and a watch
resumed through the proxy from an older ``resourceVersion`` meets the 410 the real server
sends once that version has left its watch cache (which, unlike the simulator, still
replays it right after a compaction); a 403 names the user the real server knows the
token as. Skipped (one line on how to enable it)
without a real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from drivers.kube import errors
from drivers.kube.client import KubeObject
from drivers.kube.resources import PODS, CoreV1
from tests.drivers.harness import Harness, open_harness
from tests.support.envtest import ADMIN, RealCluster


@pytest.fixture
async def real(real_cluster: RealCluster, tmp_path: Path) -> AsyncIterator[Harness]:
    async with open_harness("real", tmp_path, real_cluster) as h:
        yield h


async def test_a_forwarded_request_reaches_the_real_server_unchanged(real: Harness) -> None:
    h = real
    name = h.name("proxied")
    h.created.append(name)
    async with h.client() as proxied:
        made = await proxied.create(PODS, h.pod_body(name, annotations={"a": "b"}),
                                    namespace=h.namespace)
        through = await proxied.get(PODS, name, namespace=h.namespace)
    direct = await h.admin.get(PODS, name, namespace=h.namespace)
    assert made["metadata"]["annotations"] == {"a": "b"}
    assert through["metadata"]["uid"] == direct["metadata"]["uid"] == made["metadata"]["uid"]
    assert through["metadata"]["annotations"] == direct["metadata"]["annotations"]
    # (resourceVersions differ: the kubelet role binds and starts the pod meanwhile)
    assert h.faults.injected == {}


async def test_an_injected_500_is_a_status_typed_as_a_server_error_and_never_sent(
        real: Harness) -> None:
    h = real
    name = h.name("refused")
    h.faults.fail_next("create", code=500, resource="pods")
    async with h.client() as proxied:
        with pytest.raises(errors.ApiServerError) as caught:
            await proxied.create(PODS, h.pod_body(name), namespace=h.namespace)
    assert caught.value.status == 500
    assert caught.value.reason == "InternalError"
    assert caught.value.retryable
    assert isinstance(caught.value.__cause__, ApiException)
    assert await h.pod(name) is None  # the real server never saw it
    assert h.faults.injected["error 500"] == 1


async def test_a_proxied_watch_is_relayed_event_by_event_until_expired(real: Harness) -> None:
    """Each event arrives while the stream is open (not at its end); ``expire_watches``
    ends it with ``ERROR`` 410 ``Expired``, the real server's words for it."""
    h = real
    first, second = h.name("streamed"), h.name("streamed")
    async with h.client() as proxied:
        listed = await proxied.list_page(PODS, namespace=h.namespace)
        since = str(listed["metadata"]["resourceVersion"])
        async with proxied.watch(PODS, namespace=h.namespace, resource_version=since,
                                 bookmarks=False, timeout_seconds=60) as events:
            await h.make_pod(first)
            assert await _added(events) == first
            await h.make_pod(second)
            assert await _added(events) == second
            assert h.faults.expire_watches() == 1
            async for event in events:
                if event["type"] == "ERROR":
                    assert (event["object"]["code"], event["object"]["reason"]) == \
                        (410, "Expired")
                    break
            else:
                raise AssertionError("the stream ended without the 410")
            assert [e async for e in events] == []  # and then it ended


async def _added(events: AsyncIterator[dict[str, object]]) -> str:
    async for event in events:
        obj = event["object"]
        assert isinstance(obj, dict)
        if event["type"] == "ADDED":
            return str(obj["metadata"]["name"])
    raise AssertionError("the stream ended")


async def test_an_expired_proxied_watch_makes_the_driver_relist(real: Harness) -> None:
    h = real
    async with h.driver() as kube:
        await kube.pods.wait_until(lambda: kube.pods.stats.watches >= 1 and kube.pods.synced,
                                   limit_seconds=h.patience)
        assert h.faults.expire_watches() >= 1
        await kube.pods.wait_until(lambda: kube.pods.stats.relists >= 1 and kube.pods.synced,
                                   limit_seconds=h.patience)
        assert kube.pods.stats.expired >= 1


async def test_ended_cut_and_randomly_dropped_proxied_watches_resume_without_a_relist(
        real: Harness) -> None:
    """``drop_watches`` ends a relayed stream, ``abrupt=True`` cuts its connection, and
    ``drop_watch_rate`` ends one after an event: the driver resumes each from its last
    version (the real server serves those) and never relists."""
    h = real
    async with h.driver() as kube:
        pods = kube.pods
        await pods.wait_until(lambda: pods.stats.watches >= 1 and pods.synced,
                              limit_seconds=h.patience)
        assert h.faults.drop_watches() >= 1
        await pods.wait_until(lambda: pods.stats.watches >= 2, limit_seconds=h.patience)
        assert h.faults.drop_watches(abrupt=True) >= 1
        await pods.wait_until(lambda: pods.stats.watches >= 3, limit_seconds=h.patience)
        h.faults.drop_watch_rate(1.0)
        name = h.name("dropped-after")
        await h.make_pod(name)
        await pods.wait_until(lambda: pods.get(f"{h.namespace}/{name}") is not None,
                              limit_seconds=h.patience)
        assert h.faults.injected["watch drop"] >= 1
        assert (pods.stats.relists, pods.stats.expired) == (0, 0)


async def _resume(api: CoreV1, namespace: str, version: str) -> list[KubeObject]:
    """The events of a watch from ``version``, until the server ends it (at once after
    an ``ERROR``, else after 3 s)."""
    async with api.watch(PODS, namespace=namespace, resource_version=version,
                         bookmarks=False, timeout_seconds=3) as events:
        return [event async for event in events]


def _expired(events: list[KubeObject], version: str) -> None:
    assert [e["type"] for e in events] == ["ERROR"], events
    status = events[0]["object"]
    assert (status["code"], status["reason"]) == (410, "Expired")
    assert status["message"].startswith(f"too old resource version: {version} (")


async def test_compaction_is_real_but_the_watch_cache_still_serves_a_resume(
        real: Harness) -> None:
    """``compact()`` compacts the real etcd at its current revision. The real server
    still replays the changes after an older version from its watch cache (a window of
    recent events, kept apart from etcd's history), so the proxy answers that resume
    itself, with the 410 the real server sends once the version has left the window."""
    h = real
    listed = await h.admin.list_page(PODS, namespace=h.namespace)
    old = str(listed["metadata"]["resourceVersion"])
    await h.make_pod(h.name("after"))
    compacted_at = h.faults.compact()
    assert compacted_at > int(old)
    direct = await _resume(h.admin, h.namespace, old)
    assert direct, "the watch cache replayed nothing"
    assert all(e["type"] != "ERROR" for e in direct), direct
    async with h.client() as proxied:
        _expired(await _resume(proxied, h.namespace, old), old)
        since = await _resume(proxied, h.namespace, str(compacted_at))  # not older: served
        assert all(e["type"] != "ERROR" for e in since), since




async def test_a_forbid_names_the_user_the_real_server_knows(real: Harness) -> None:
    h = real
    h.faults.forbid("get", "pods", namespace=h.namespace)
    async with h.client() as proxied:
        with pytest.raises(errors.ApiForbidden) as caught:
            await proxied.get(PODS, "anyone", namespace=h.namespace)
    assert f'User "{ADMIN.user}" cannot get resource "pods"' in str(caught.value)


async def test_a_resume_from_before_the_watch_cache_meets_the_real_servers_410(
        real: Harness, real_cluster: RealCluster, tmp_path: Path) -> None:
    """The real server's own 410 on a resume, in the words the proxy uses: after a
    restart its watch cache begins at the current version (envtest only)."""
    h = real
    listed = await h.admin.list_page(PODS, namespace=h.namespace)
    old = str(listed["metadata"]["resourceVersion"])
    await h.make_pod(h.name("before-restart"))
    h.faults.compact()
    await asyncio.to_thread(real_cluster.restart_apiserver)
    async with open_harness("real", tmp_path / "restarted", real_cluster) as after:
        expired = await _resume(after.admin, after.namespace, old)
        _expired(expired, old)
        # "(N)": the oldest version it resumes from, as the proxy's 410 names it.
        oldest = expired[0]["object"]["message"].rsplit("(", 1)[1].rstrip(")")
        resumed = await _resume(after.admin, after.namespace, oldest)
        assert all(e["type"] != "ERROR" for e in resumed), resumed
