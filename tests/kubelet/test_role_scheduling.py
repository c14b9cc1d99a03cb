"""The kubelet role registers Ready nodes and places pods as a scheduler would, on the
simulator and on a real API server alike: binding through ``pods/binding``, refusing with
``PodScheduled=False/Unschedulable`` and the scheduler's reason, retrying on changes."""

from __future__ import annotations

from collections.abc import Callable

from drivers.kube.client import KubeObject
from drivers.kube.resources import NODES
from drivers.sim.objects import condition
from drivers.sim.scheduling import UNSCHEDULABLE_TAINT
from tests.kubelet.world import World


def _affinity(node: str) -> KubeObject:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}


def _running(pod: KubeObject | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def _refused(reason: str) -> Callable[[KubeObject | None], bool]:
    def check(pod: KubeObject | None) -> bool:
        found = condition(pod or {}, "PodScheduled")
        return found is not None and found.get("status") == "False" and \
            found.get("reason") == "Unschedulable" and reason in str(found.get("message"))
    return check


def _name(pod: KubeObject) -> str:
    return str(pod["metadata"]["name"])


async def test_nodes_are_registered_ready_untainted_with_capacity(world: World) -> None:
    """Every node of the role: Ready, no not-ready taint, hostname label, 4 / 8Gi / 110."""
    for name in world.nodes:
        node = await world.admin.get(NODES, name)
        ready = condition(node, "Ready")
        assert ready is not None
        assert ready["status"] == "True"
        assert ready.get("lastHeartbeatTime")
        taints = (node.get("spec") or {}).get("taints") or []
        assert not [t for t in taints if t.get("key") == "node.kubernetes.io/not-ready"]
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        assert node["status"]["allocatable"] == {"cpu": "4", "memory": "8Gi", "pods": "110"}
        assert node["status"]["capacity"] == node["status"]["allocatable"]


async def test_pod_with_required_affinity_is_bound_there_and_runs(world: World) -> None:
    """Bound through pods/binding to the affinity's node, then Running, Ready, with IPs."""
    pod = await world.make_pod("affine", affinity=_affinity("node-2"))
    seen = await world.wait_pod(_name(pod), _running, what="Running")
    assert seen is not None
    assert seen["spec"]["nodeName"] == "node-2"
    status = seen["status"]
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert (condition(seen, type_) or {}).get("status") == "True", type_
    assert status["podIP"].startswith("10.244.")
    assert status["hostIP"] == "10.0.0.2"
    assert status["startTime"]
    assert [c["ready"] for c in status["containerStatuses"]] == [True]
    assert status["qosClass"] == "BestEffort"  # set at creation, never rewritten
    if world.sim is not None:  # the simulator's audit shows how it was placed
        audit = world.sim.server.audit
        assert sum(n for k, n in audit.items() if k[1:4] == ("create", "pods", "binding")) >= 1


async def test_node_selector_is_respected(world: World) -> None:
    pod = await world.make_pod("selected", nodeSelector={"kubernetes.io/hostname": "node-3"})
    seen = await world.wait_pod(_name(pod), _running, what="Running")
    assert seen is not None
    assert seen["spec"]["nodeName"] == "node-3"


async def test_pod_that_fits_nowhere_stays_pending_unschedulable(world: World) -> None:
    """More CPU than any node has: PodScheduled=False/Unschedulable, not bound, Pending."""
    pod = await world.make_pod("huge", containers=[
        {"name": "main", "image": "registry.k8s.io/pause:3.9",
         "resources": {"requests": {"cpu": "100"}}}])
    seen = await world.wait_pod(_name(pod), _refused("Insufficient cpu"), what="refused")
    assert seen is not None
    assert not seen["spec"].get("nodeName")
    assert seen["status"]["phase"] == "Pending"
    found = condition(seen, "PodScheduled")
    assert found is not None
    assert found["message"].startswith("0/3 nodes are available")


async def test_untolerated_taint_refuses_until_removed(world: World) -> None:
    """A tainted node refuses a pod that does not tolerate it and takes one that does;
    removing the taint places the refused pod (the role retries on node changes)."""
    key = world.name("kubelet-role.test/taint")
    await world.edit_node("node-1", {"taints": [{"key": key, "value": "x",
                                                 "effect": "NoSchedule"}]})
    refused = await world.make_pod("untolerant", affinity=_affinity("node-1"))
    await world.wait_pod(_name(refused), _refused("untolerated taint"), what="refused")
    tolerant = await world.make_pod("tolerant", affinity=_affinity("node-1"), tolerations=[
        {"key": key, "operator": "Equal", "value": "x", "effect": "NoSchedule"}])
    seen = await world.wait_pod(_name(tolerant), _running, what="Running")
    assert seen is not None
    assert seen["spec"]["nodeName"] == "node-1"
    await world.restore_node("node-1")
    seen = await world.wait_pod(_name(refused), _running, what="Running once untainted")
    assert seen is not None
    assert seen["spec"]["nodeName"] == "node-1"


async def test_cordoned_node_takes_no_pod_until_uncordoned(world: World) -> None:
    await world.edit_node("node-2", {"unschedulable": True})
    pod = await world.make_pod("cordoned", affinity=_affinity("node-2"))
    await world.wait_pod(_name(pod), _refused("unschedulable"), what="refused")
    tolerant = await world.make_pod("cordon-tolerant", affinity=_affinity("node-2"),
                                    tolerations=[{"key": UNSCHEDULABLE_TAINT,
                                                  "operator": "Exists",
                                                  "effect": "NoSchedule"}])
    await world.wait_pod(_name(tolerant), _running, what="Running despite the cordon")
    await world.restore_node("node-2")
    seen = await world.wait_pod(_name(pod), _running, what="Running once uncordoned")
    assert seen is not None
    assert seen["spec"]["nodeName"] == "node-2"


async def test_pods_capacity_of_a_node_is_respected(world: World) -> None:
    """Requests count against allocatable: two pods of 3 CPUs never share a 4-CPU node."""
    big = [{"name": "main", "image": "registry.k8s.io/pause:3.9",
            "resources": {"requests": {"cpu": "3"}}}]
    first = await world.make_pod("big", containers=big, affinity=_affinity("node-3"))
    await world.wait_pod(_name(first), _running, what="Running")
    second = await world.make_pod("big", containers=big, affinity=_affinity("node-3"))
    await world.wait_pod(_name(second), _refused("Insufficient cpu"), what="refused")
