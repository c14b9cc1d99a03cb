"""``pods/binding`` and the role's UID-guarded status patch answer the same on the simulator
and on a real API server (the contract the role relies on)."""

from __future__ import annotations

import pytest

from drivers.kube.client import KubeObject
from drivers.kube.errors import ApiBadRequest, ApiConflict, ApiNotFound
from drivers.kube.resources import MERGE, PODS, path
from drivers.sim.objects import condition
from tests.kubelet.world import NAMESPACE, World


async def _bind(world: World, name: str, node: str, uid: str | None = None) -> KubeObject:
    body: KubeObject = {"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": name, **({"uid": uid} if uid else {})},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return await world.admin.client.request("create", "POST",
                                            path(PODS, NAMESPACE, name, "binding"),
                                            resource="pods", namespace=NAMESPACE, body=body)


async def test_binding_assigns_once_then_conflicts(world: World) -> None:
    """201 + Status Success and PodScheduled=True; a second binding is a 409 naming the
    node; a missing pod is a 404; a stale UID is a 409 precondition failure."""
    # Another scheduler's pod: the role leaves it alone, the test binds it by hand.
    pod = await world.make_pod("manual", schedulerName="someone-else")
    name = pod["metadata"]["name"]
    with pytest.raises(ApiConflict, match="Precondition failed: UID in precondition"):
        await _bind(world, name, "node-1", uid="00000000-0000-0000-0000-000000000000")
    answer = await _bind(world, name, "node-1", uid=pod["metadata"]["uid"])
    assert answer == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                      "status": "Success", "code": 201}
    bound = await world.admin.get(PODS, name, namespace=NAMESPACE)
    assert bound["spec"]["nodeName"] == "node-1"
    assert (condition(bound, "PodScheduled") or {}).get("status") == "True"
    with pytest.raises(ApiConflict) as refused:
        await _bind(world, name, "node-2")
    assert f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is ' \
           f'already assigned to node "node-1"' in str(refused.value)
    with pytest.raises(ApiNotFound):
        await _bind(world, world.name("missing"), "node-1")


async def test_status_patch_with_a_stale_uid_is_refused(world: World) -> None:
    """The role's status patches carry the UID it saw: a successor pod refuses them."""
    pod = await world.make_pod("guarded", schedulerName="someone-else")
    name = pod["metadata"]["name"]
    with pytest.raises(ApiBadRequest, match=r"metadata\.uid: .* field is immutable"):
        await world.admin.patch(PODS, name, {
            "metadata": {"uid": "00000000-0000-0000-0000-000000000000"},
            "status": {"phase": "Running"}}, namespace=NAMESPACE, patch_type=MERGE,
            subresource="status")
    after = await world.admin.get(PODS, name, namespace=NAMESPACE)
    assert after["status"]["phase"] == "Pending"
