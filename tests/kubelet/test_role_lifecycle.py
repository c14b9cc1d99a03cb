"""The kubelet role finishes deletions (UID-fenced: a same-name successor is never hit)
and keeps working through broken watches, compaction and an API server restart."""

from __future__ import annotations

import pytest

from drivers.kube.client import KubeObject
from drivers.kube.errors import ApiNotFound
from drivers.kube.resources import PODS
from drivers.kubelet import KubeletRole
from drivers.kubelet.decide import Bind, Finish
from tests.kubelet.world import NAMESPACE, World, admin_client, role_options


def _running(pod: KubeObject | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def _gone(pod: KubeObject | None) -> bool:
    return pod is None


async def test_deleted_pod_is_finished_by_the_role(world: World) -> None:
    """A bound pod deleted with its 30 s grace disappears: the role's final delete."""
    pod = await world.make_pod("doomed")
    name = pod["metadata"]["name"]
    await world.wait_pod(name, _running, what="Running")
    await world.admin.delete(PODS, name, namespace=NAMESPACE)
    terminating = await world.pod(name)  # graceful: the server alone does not remove it
    assert terminating is None or terminating["metadata"].get("deletionTimestamp")
    await world.wait_pod(name, _gone, what="gone")


async def test_stale_uid_never_touches_a_same_name_successor(world: World) -> None:
    """Finish and Bind carried out for a pod that has since been replaced by one of the
    same name are refused by the UID preconditions; the successor keeps running."""
    first = await world.make_pod("reborn")
    name = first["metadata"]["name"]
    stale = await world.wait_pod(name, _running, what="Running")
    assert stale is not None
    await world.admin.delete(PODS, name, namespace=NAMESPACE, grace_period_seconds=0)
    await world.wait_pod(name, _gone, what="gone")
    body = {"metadata": {"name": name, "labels": {"test": "kubelet-role"}},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}
    second = await world.admin.create(PODS, body, namespace=NAMESPACE)
    successor = await world.wait_pod(name, _running, what="successor Running")
    assert successor is not None

    api = await admin_client(world.kubeconfig)
    try:
        role = KubeletRole(api, role_options())  # not started: only its writes are used
        assert await role.carry_out(Finish(stale, 0.0))  # done: refused by the UID
        unbound = {**stale, "spec": {**stale["spec"], "nodeName": ""}}
        assert await role.carry_out(Bind(unbound, "node-1"))
    finally:
        await api.client.close()
    after = await world.pod(name)
    assert after is not None
    assert after["metadata"]["uid"] == second["metadata"]["uid"]
    assert after["metadata"].get("deletionTimestamp") is None
    assert after["spec"]["nodeName"] == successor["spec"]["nodeName"]
    assert role.stats.finishes == 0
    assert role.stats.binds == 0


async def test_role_survives_a_broken_watch(world: World) -> None:
    """After every watch breaks (simulator: dropped, history compacted so resuming gets
    410; real server: the API server restarted), new pods are still placed and run."""
    before = await world.make_pod("before")
    await world.wait_pod(before["metadata"]["name"], _running, what="Running")
    if world.sim is not None:
        assert world.role is not None
        caches = (world.role.pods, world.role.nodes)
        broken = [c.stats.errors + c.stats.expired for c in caches]
        world.sim.faults.compact()
        world.sim.faults.drop_watches(abrupt=True)
    else:
        assert world.real is not None
        world.real.restart_apiserver()
    after = await world.make_pod("after")
    seen = await world.wait_pod(after["metadata"]["name"], _running, what="Running",
                                limit_seconds=60)
    assert seen is not None
    await world.admin.delete(PODS, after["metadata"]["name"], namespace=NAMESPACE)
    await world.wait_pod(after["metadata"]["name"], _gone, what="finished after the break")
    if world.sim is not None:  # every watch broke; the stale one resumed through a 410
        assert all(c.stats.errors + c.stats.expired > n for c, n in zip(caches, broken,
                                                                         strict=True))
        assert sum(c.stats.expired for c in caches) >= 1


async def test_finish_of_a_pod_already_gone_counts_as_done(world: World) -> None:
    """A 404 on the final delete is success (someone else finished it)."""
    pod = await world.make_pod("vanished")
    name = pod["metadata"]["name"]
    await world.admin.delete(PODS, name, namespace=NAMESPACE, grace_period_seconds=0)
    with pytest.raises(ApiNotFound):
        await world.admin.get(PODS, name, namespace=NAMESPACE)
    api = await admin_client(world.kubeconfig)
    try:
        role = KubeletRole(api, role_options())
        assert await role.carry_out(Finish(pod, 0.0))
    finally:
        await api.client.close()
