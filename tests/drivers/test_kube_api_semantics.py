"""The API-server behaviours the driver relies on, pinned where the simulator could differ.

Each test runs on the simulator and, when ``CONTROLPLANE_TEST_KUBECONFIG`` is set, on a
real cluster (see ``harness.py``): a real run that fails here means the simulator has
drifted from Kubernetes, or Kubernetes changed under the driver. Each docstring names
the real behaviour pinned and the driver code that depends on it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from drivers.kube import errors
from drivers.kube.bodies import event_body
from drivers.kube.handlers import uid_mismatch, uid_precondition_failed
from drivers.kube.resources import EVENTS, JSON_PATCH, MERGE, PODS
from tests.drivers.harness import Harness


async def test_a_delete_with_another_uid_is_a_uid_precondition_conflict(
        harness: Harness) -> None:
    """Pins: ``DELETE`` with ``preconditions.uid`` of another object is ``409 Conflict``
    whose message says ``the UID in the precondition (…) does not match the UID in record``
    (or the storage layer's ``Precondition failed: UID in precondition``), and the object
    stays.
    Relied on by ``DeletePod`` (``uid_precondition_failed``: done without a GET)."""
    h = harness
    name = h.name("precondition")
    await h.make_pod(name)
    with pytest.raises(errors.ApiConflict) as caught:
        await h.admin.delete(PODS, name, namespace=h.namespace,
                             uid="00000000-0000-0000-0000-000000000000")
    assert type(caught.value) is errors.ApiConflict
    assert caught.value.reason == "Conflict"
    assert uid_precondition_failed(caught.value), str(caught.value)
    assert await h.pod(name) is not None


async def test_a_patch_that_changes_metadata_uid_is_invalid(harness: Harness) -> None:
    """Pins: a strategic merge patch carrying another ``metadata.uid`` is ``422 Invalid``
    (``metadata.uid`` is immutable) and changes nothing. Relied on by ``AnnotatePod`` /
    ``RemovePodAnnotations`` (``uid_mismatch``: never patch a same-named newcomer)."""
    h = harness
    name = h.name("uid-guard")
    await h.make_pod(name)
    with pytest.raises(errors.ApiBadRequest) as caught:
        await h.admin.patch(PODS, name, {"metadata": {
            "uid": "00000000-0000-0000-0000-000000000000", "annotations": {"x": "1"}}},
            namespace=h.namespace)
    assert caught.value.status == 422
    assert uid_mismatch(caught.value), str(caught.value)
    pod = await h.pod(name)
    assert pod is not None
    assert "x" not in (pod["metadata"].get("annotations") or {})


async def test_a_patch_that_changes_nothing_keeps_the_resource_version(
        harness: Harness) -> None:
    """Pins: a no-op patch neither bumps ``resourceVersion`` nor emits a watch event.
    Relied on by the cache's relist diff (unchanged version: no wake) and by idempotent
    annotation handlers (a repeat costs the machines nothing). (An Event, not a pod: no
    kubelet or scheduler writes to it between the two patches on a real cluster.)"""
    h = harness
    name = h.name("no-op")
    body = event_body(namespace=h.namespace, name=name, involved={"kind": "Pod", "name": name},
                      type_="Normal", reason="Pinned", message="no-op patch",
                      component="contract-test", at=datetime(2026, 1, 1, tzinfo=UTC))
    await h.admin.create(EVENTS, body, namespace=h.namespace)
    patch = {"metadata": {"annotations": {"same": "1"}}}
    before = await h.admin.patch(EVENTS, name, patch, namespace=h.namespace, patch_type=MERGE)
    again = await h.admin.patch(EVENTS, name, patch, namespace=h.namespace, patch_type=MERGE)
    assert again["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_a_stale_resource_version_in_a_patch_is_a_retryable_conflict(
        harness: Harness) -> None:
    """Pins: a merge patch whose ``metadata.resourceVersion`` is stale is ``409 Conflict``
    (not ``AlreadyExists``), which the driver types as the retryable ``ApiConflict``."""
    h = harness
    name = h.name("stale-rv")
    created = await h.make_pod(name)
    await h.admin.patch(PODS, name, {"metadata": {"annotations": {"bump": "1"}}},
                        namespace=h.namespace)
    with pytest.raises(errors.ApiConflict) as caught:
        await h.admin.patch(PODS, name, {"metadata": {
            "resourceVersion": created["metadata"]["resourceVersion"],
            "annotations": {"late": "1"}}}, namespace=h.namespace, patch_type=MERGE)
    assert type(caught.value) is errors.ApiConflict
    assert caught.value.retryable


async def test_a_failed_json_patch_test_is_invalid_not_a_conflict(harness: Harness) -> None:
    """Pins: a JSON patch whose ``test`` op fails is ``422 Invalid`` — terminal, never
    retried as if it were a conflict."""
    h = harness
    name = h.name("json-test")
    await h.make_pod(name)
    with pytest.raises(errors.ApiBadRequest) as caught:
        await h.admin.patch(PODS, name, [
            {"op": "test", "path": "/metadata/name", "value": "someone-else"}],
            namespace=h.namespace, patch_type=JSON_PATCH)
    assert caught.value.status == 422
    assert not caught.value.retryable


async def test_listing_a_namespace_that_does_not_exist_is_empty(harness: Harness) -> None:
    """Pins: LIST of pods in a namespace that does not exist is an empty list (200), not a
    404 — unlike a create there (see ``test_kube_errors``). A namespace-scoped cache of a
    missing namespace therefore syncs empty instead of failing."""
    h = harness
    items, version = await h.admin.list_all(PODS, namespace=h.name("no-such-namespace"))
    assert items == []
    assert version


async def test_a_list_resource_version_resumes_a_watch_without_replaying_the_list(
        harness: Harness) -> None:
    """Pins: a watch from a LIST's ``resourceVersion`` sends only later changes (no
    synthetic ADDED for what the list returned). Relied on by the watch cache, which
    lists once and then watches from the list's version."""
    h = harness
    first = h.name("listed")
    await h.make_pod(first)
    items, version = await h.admin.list_all(PODS, namespace=h.namespace)
    assert any(i["metadata"]["name"] == first for i in items)
    later = h.name("later")
    await h.make_pod(later)
    seen: list[tuple[str, str]] = []
    async with h.admin.watch(PODS, namespace=h.namespace, resource_version=version,
                             timeout_seconds=int(h.patience)) as events:
        async for event in events:
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                seen.append((event["type"], event["object"]["metadata"]["name"]))
            if ("ADDED", later) in seen:
                break
    assert ("ADDED", later) in seen
    assert ("ADDED", first) not in seen
