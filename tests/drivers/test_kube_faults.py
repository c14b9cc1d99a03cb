"""The cluster port under faults: 410s, dropped watches, typed errors, timeouts.

Part of the contract suite (same ``harness``): on a real cluster the faults are the
simulator's rules applied by the fault proxy in front of it (see ``harness.py``); the
one test that needs a bookmark on demand stays on the simulator. Invariants
pinned: the cache heals a compacted history by relisting and resumes from bookmarks
without relisting; every API failure is a typed error chained from the transport error,
retryable or not by type; handlers turn them into the worker's retryable/terminal
errors; an unsynced cache never answers "absent" by itself.

The "Pins" lines name the real API-server behaviour each fault imitates: the fault is
injected by the simulator (or the proxy), but what it sends is what a real server sends.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, PodView, ProbeError
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from drivers.kube import errors
from drivers.kube.driver import KubeDriver
from drivers.kube.resources import PODS
from tests.drivers.harness import Harness, Wakes


async def _watching(h: Harness, kube: KubeDriver) -> None:
    """Until the pod cache's watch is open on the server (a fault can then hit it)."""
    await kube.pods.wait_until(lambda: kube.pods.stats.watches >= 1 and kube.pods.synced,
                               limit_seconds=h.patience)


async def test_the_cache_relists_after_a_410_and_sees_what_it_missed(harness: Harness) -> None:
    """History compacted + watch expired: the cache relists (no events lost) and wakes the
    UID of a pod created meanwhile.

    Pins: after etcd compaction a real server ends a watch with an ``ERROR`` event whose
    object is a ``Status`` with code 410, reason ``Expired`` (HTTP status still 200)."""
    h, wakes = harness, Wakes()
    faults = h.faults
    async with h.driver(wakes) as kube:
        await _watching(h, kube)
        faults.compact()
        assert faults.expire_watches() >= 1
        name = h.name("after-410")
        uid = (await h.make_pod(name))["metadata"]["uid"]
        await kube.pods.wait_until(lambda: kube.pods.get_by_uid(uid) is not None,
                                   limit_seconds=h.patience)
        await wakes.wait_for(uid, limit_seconds=h.patience)
        assert kube.pods.stats.expired >= 1
        assert kube.pods.stats.relists >= 1


async def test_a_dropped_watch_resuming_into_compacted_history_relists(
        harness: Harness) -> None:
    """The watch connection is cut while the history is compacted away: resuming from
    the old resourceVersion gets 410, so the cache relists and catches up.

    Pins: a watch from a compacted ``resourceVersion`` is answered 200 with one ``ERROR``
    410 event ("too old resource version"), not an HTTP 410."""
    h = harness
    faults = h.faults
    async with h.driver() as kube:
        await _watching(h, kube)
        name = h.name("missed")
        # The resume waits until the pod is created and the history compacted, so the cut
        # watch never carries the pod and its resume version is older than the history.
        faults.delay_next("watch", 1.0, resource="pods")
        faults.drop_watches(abrupt=True)
        await h.make_pod(name)
        faults.compact()
        await kube.pods.wait_until(lambda: kube.pods.stats.relists >= 1 and kube.pods.synced,
                                   limit_seconds=h.patience)
        assert kube.pods.get(f"{h.namespace}/{name}") is not None


async def test_a_watch_resumes_from_its_bookmark_without_relisting(harness: Harness) -> None:
    """A bookmark moves the cache's resourceVersion past writes it does not watch (nodes),
    so after compaction a dropped watch resumes from there: no 410, no relist.

    Pins: with ``allowWatchBookmarks`` a real server sends ``BOOKMARK`` events carrying
    only ``metadata.resourceVersion``, a version from the one global etcd counter."""
    h = harness
    faults = h.faults
    cluster = h.sim_only("a real server sends bookmarks when it chooses (about once a "
                         "minute), never on request, and its version counter is not readable")
    store = cluster.store
    async with h.driver() as kube:
        await _watching(h, kube)
        first = h.name("bookmarked")
        await h.make_pod(first)
        await kube.pods.wait_until(
            lambda: (kube.pods.get(f"{h.namespace}/{first}") or {}).get("status", {}).get(
                "phase") == "Running", limit_seconds=h.patience)
        cluster.cordon(h.nodes[0])  # writes the pod watch does not carry
        cluster.uncordon(h.nodes[0])
        assert int(kube.pods.resource_version) < store.rv
        assert faults.send_bookmarks() >= 1
        await kube.pods.wait_until(lambda: kube.pods.resource_version == str(store.rv),
                                   limit_seconds=h.patience)
        faults.compact()
        faults.drop_watches()
        name = h.name("after-drop")
        await h.make_pod(name)
        await kube.pods.wait_until(lambda: kube.pods.get(f"{h.namespace}/{name}") is not None,
                                   limit_seconds=h.patience)
        assert kube.pods.stats.bookmarks >= 1
        assert kube.pods.stats.watches >= 2
        assert (kube.pods.stats.expired, kube.pods.stats.relists) == (0, 0)


@pytest.mark.parametrize(("code", "expected", "retryable"), [
    (403, errors.ApiForbidden, False),
    (404, errors.ApiNotFound, False),
    (409, errors.ApiConflict, True),
    (429, errors.ApiTooManyRequests, True),
    (500, errors.ApiServerError, True),
])
async def test_api_failures_are_typed_and_chained(harness: Harness, code: int,
                                                  expected: type[errors.KubeApiError],
                                                  retryable: bool) -> None:
    """Each status maps to its error class, chained from the client's ApiException.

    Pins: a real server's refusals are ``Status`` bodies with ``code`` and ``reason``;
    429 carries ``Retry-After`` (and ``details.retryAfterSeconds``)."""
    h = harness
    name = h.name("typed")
    await h.make_pod(name)
    h.faults.fail_next("get", code=code, resource="pods")
    async with h.client() as api:
        with pytest.raises(expected) as caught:
            await api.get(PODS, name, namespace=h.namespace)
    error = caught.value
    assert type(error) is expected
    assert error.status == code
    assert error.retryable is retryable
    assert isinstance(error.__cause__, ApiException)
    assert error.__cause__.status == code
    if code == 429:
        assert error.retry_after == 1.0


async def test_a_second_create_is_already_exists_not_a_conflict(harness: Harness) -> None:
    """Pins (no fault: runs on a real cluster too): POST of an existing name is 409 with
    reason ``AlreadyExists``, which the driver keeps apart from a retryable conflict."""
    h = harness
    name = h.name("twice")
    body = h.pod_body(name)
    await h.make_pod(name)
    with pytest.raises(errors.ApiAlreadyExists) as caught:
        await h.admin.create(PODS, body, namespace=h.namespace)
    assert caught.value.reason == "AlreadyExists"
    assert not caught.value.retryable


async def test_a_slow_server_is_a_retryable_timeout(harness: Harness) -> None:
    """Pins: nothing of the server; the client's own ``request_timeout`` bounds a call."""
    h = harness
    h.faults.delay_next("get", 30.0)
    async with h.client(request_timeout=0.2) as api:
        with pytest.raises(errors.ApiTimeout) as caught:
            await api.get(PODS, "whatever", namespace=h.namespace)
    assert caught.value.retryable
    assert isinstance(caught.value.__cause__, TimeoutError)


@pytest.mark.parametrize(("verb", "code", "action_type", "expected", "error_class"), [
    ("patch", 403, "AnnotatePod", TerminalActionError, "Forbidden"),
    ("patch", 500, "RemovePodAnnotations", RetryableActionError, "InternalError"),
    ("delete", 429, "DeletePod", RetryableActionError, "TooManyRequests"),
    ("create", 403, "CreatePod", TerminalActionError, "Forbidden"),
    ("create", 503, "EmitEvent", RetryableActionError, "ServiceUnavailable"),
])
async def test_handlers_turn_api_failures_into_worker_errors(
        harness: Harness, verb: str, code: int, action_type: str,
        expected: type[Exception], error_class: str) -> None:
    """Retryable by type, the API reason as ``error_class``, chained from the typed error.

    Pins: the reasons a real server gives (``Forbidden``, ``InternalError``,
    ``TooManyRequests``, ``ServiceUnavailable``) become the recorded ``error_class``."""
    h = harness
    name = h.name("failing")
    uid = (await h.make_pod(name))["metadata"]["uid"]
    params = {
        "AnnotatePod": {"uid": uid, "annotations": {"a": "b"}},
        "RemovePodAnnotations": {"uid": uid, "keys": ["a"]},
        "DeletePod": {"uid": uid, "reason": "test"},
        "CreatePod": {"name": h.name("new"), "template": {"spec": h.pod_body(name)["spec"]},
                      "node": None, "annotations": {}, "labels": {}},
        "EmitEvent": {"object": {"kind": "Pod", "name": name, "uid": uid}, "type": "Normal",
                      "reason": "Test", "message": "hello"},
    }[action_type]
    action = Action(action_type, "f/1", {"namespace": h.namespace, "name": name, **params})
    h.faults.fail_next(verb, code=code)
    async with h.driver() as kube:
        with pytest.raises(expected) as caught:
            await kube.handlers()[action_type](action)
    assert getattr(caught.value, "error_class", None) == error_class
    assert isinstance(caught.value.__cause__, errors.KubeApiError)


async def test_malformed_action_params_are_terminal(harness: Harness) -> None:
    """Pins: nothing of the server; bad params never reach it."""
    h = harness
    async with h.driver() as kube:
        with pytest.raises(TerminalActionError):
            await kube.handlers()["DeletePod"](Action("DeletePod", "m/1", {"namespace": "x"}))


async def test_an_unsynced_cache_reads_through_and_never_says_absent_on_error(
        harness: Harness) -> None:
    """While the watch is failing, the observer reads through; a failed read is a
    ProbeError with the API reason, never ``None``.

    Pins: a GET of an existing pod answers it even while watches fail; a 403 is a
    ``Forbidden`` Status (never a 404 that would read as "absent")."""
    h = harness
    faults = h.faults
    name = h.name("through")
    key = f"{h.namespace}/{name}"
    async with h.driver() as kube:
        uid = (await h.make_pod(name))["metadata"]["uid"]
        await _watching(h, kube)
        await kube.pods.wait_until(lambda: kube.pods.get(key) is not None,
                                   limit_seconds=h.patience)
        faults.fail_next("watch", times=None, code=500, resource="pods")
        faults.drop_watches()
        await kube.pods.wait_until(lambda: not kube.pods.synced, limit_seconds=h.patience)
        seen = await kube.observer.observe(Interests(pods=frozenset({key})))
        pod = seen.pods[key]
        assert isinstance(pod, PodView)
        assert pod.uid == uid
        faults.fail_next("get", code=403, resource="pods")
        seen = await kube.observer.observe(Interests(pods=frozenset({key})))
        failed = seen.pods[key]
        assert isinstance(failed, ProbeError)
        assert (failed.error_class, failed.retryable) == ("Forbidden", False)
        faults.clear()
        await kube.pods.wait_until(lambda: kube.pods.synced, limit_seconds=h.patience)
        assert kube.pods.stats.errors >= 1
