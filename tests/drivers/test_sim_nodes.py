"""The simulated scheduler and kubelets: placement, capacity, cordons, taints, failures.

Invariants pinned: a pod runs only on a node its REQUIRED affinity and tolerations
allow, that is Ready, uncordoned and has room for its requests; an unschedulable pod
says why like the real scheduler and is placed as soon as room appears; a NotReady node
turns its pods unready and holds their deletion; a drain cordons and evicts; the
workload marker survives every kubelet update. Every wait is on store changes.
"""

from __future__ import annotations

from typing import Any

from drivers.sim import MARKER, SimCluster, scheduling

Obj = dict[str, Any]


def _pod(sim: SimCluster, name: str) -> Obj:
    pod = sim.pod("default", name)
    assert pod is not None
    return pod


def _phase(sim: SimCluster, name: str) -> str | None:
    pod = sim.pod("default", name)
    return None if pod is None else pod["status"].get("phase")


def _condition(pod: Obj, type_: str) -> Obj:
    return next(c for c in pod["status"].get("conditions", []) if c["type"] == type_)


def _unschedulable(sim: SimCluster, name: str) -> bool:
    pod = sim.pod("default", name)
    return pod is not None and any(c["type"] == "PodScheduled" and c["status"] == "False"
                                   for c in pod["status"].get("conditions", []))


async def test_a_pod_runs_where_its_required_affinity_says(sim: SimCluster) -> None:
    sim.create_pod("default", "pinned", node="node-3", marker="state-1")
    await sim.wait_for(lambda: _phase(sim, "pinned") == "Running")
    pod = _pod(sim, "pinned")
    assert pod["spec"]["nodeName"] == "node-3"
    assert _condition(pod, "Ready")["status"] == "True"
    status = pod["status"]
    assert status["podIP"].startswith("10.244.")
    assert status["hostIP"] == "10.0.0.3"
    assert status["containerStatuses"][0]["ready"] is True
    assert sim.marker("default", "pinned") == "state-1", "kubelet updates keep the marker"


async def test_a_cordoned_target_leaves_the_pod_pending_with_the_reason(
        sim: SimCluster) -> None:
    sim.cordon("node-2")
    sim.create_pod("default", "blocked", node="node-2")
    await sim.wait_for(lambda: _unschedulable(sim, "blocked"))
    message = _condition(_pod(sim, "blocked"), "PodScheduled")["message"]
    assert message == ("0/3 nodes are available: 2 node(s) didn't match Pod's node "
                       "affinity/selector, 1 node(s) were unschedulable.")
    sim.uncordon("node-2")
    await sim.wait_for(lambda: _phase(sim, "blocked") == "Running")
    assert _pod(sim, "blocked")["spec"]["nodeName"] == "node-2"


async def test_requests_beyond_capacity_wait_until_room_appears() -> None:
    async with SimCluster(nodes=1, node_cpu="1", node_memory="1Gi") as sim:
        sim.create_pod("default", "big", cpu="600m", memory="256Mi")
        await sim.wait_for(lambda: _phase(sim, "big") == "Running")
        sim.create_pod("default", "second", cpu="600m")
        await sim.wait_for(lambda: _unschedulable(sim, "second"))
        assert "Insufficient cpu" in _condition(_pod(sim, "second"), "PodScheduled")["message"]
        sim.store.delete("pods", "default", "big")
        await sim.wait_for(lambda: _phase(sim, "second") == "Running")


async def test_taints_repel_pods_without_a_toleration(sim: SimCluster) -> None:
    for node in sim.node_names:
        sim.taint(node, "dedicated", "gpu")
    sim.create_pod("default", "plain")
    await sim.wait_for(lambda: _unschedulable(sim, "plain"))
    sim.store.create("pods", "default", {
        "metadata": {"name": "tolerant"},
        "spec": {"containers": [{"name": "c", "image": "i"}],
                 "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu",
                                  "effect": "NoSchedule"}]}})
    await sim.wait_for(lambda: _phase(sim, "tolerant") == "Running")
    assert _phase(sim, "plain") == "Pending"


async def test_a_failed_node_makes_its_pods_unready_and_holds_their_deletion(
        sim: SimCluster) -> None:
    pod = sim.create_pod("default", "stranded", node="node-1")
    await sim.wait_for(lambda: _phase(sim, "stranded") == "Running")
    sim.fail_node("node-1")
    await sim.wait_for(lambda: _condition(_pod(sim, "stranded"), "Ready")["status"] == "False")
    sim.store.delete("pods", "default", "stranded", uid=pod["metadata"]["uid"])
    terminating = _pod(sim, "stranded")
    assert terminating["metadata"]["deletionTimestamp"], "no kubelet confirms the stop"
    sim.recover_node("node-1")
    await sim.wait_for(lambda: sim.pod("default", "stranded") is None)


async def test_a_drain_cordons_and_evicts_and_new_pods_go_elsewhere(sim: SimCluster) -> None:
    sim.create_pod("default", "a", node="node-1")
    sim.create_pod("default", "b", node="node-1")
    await sim.wait_for(lambda: _phase(sim, "a") == _phase(sim, "b") == "Running")
    assert sorted(sim.drain("node-1")) == ["default/a", "default/b"]
    await sim.wait_for(lambda: sim.pod("default", "a") is None and sim.pod("default", "b")
                       is None)
    node = sim.store.get("nodes", "", "node-1")
    assert node["spec"]["unschedulable"] is True
    sim.create_pod("default", "c")
    await sim.wait_for(lambda: _phase(sim, "c") == "Running")
    assert _pod(sim, "c")["spec"]["nodeName"] != "node-1"


async def test_the_marker_is_the_pods_workload_state(sim: SimCluster) -> None:
    sim.create_pod("default", "stateful")
    sim.set_marker("default", "stateful", "counter=41")
    await sim.wait_for(lambda: _phase(sim, "stateful") == "Running")
    assert _pod(sim, "stateful")["metadata"]["annotations"][MARKER] == "counter=41"
    assert sim.marker("default", "absent") is None


async def test_a_pod_change_makes_the_kubelets_look_at_that_pod_only(
        sim: SimCluster, monkeypatch: Any) -> None:
    """A pass after one pod changed does not walk every pod: the simulator's CPU per
    operation must not grow with the number of pods (it did, and at 10,000 pods cost more
    than the control plane it served)."""
    for i in range(30):
        sim.create_pod("default", f"p{i}")
    await sim.wait_for(lambda: all(_phase(sim, f"p{i}") == "Running" for i in range(30)))
    sim.kubelets.reconcile_changed()  # whatever the loop has not looked at yet
    looked_at: list[str] = []
    follow = sim.kubelets._follow_node

    def spy(pod: Obj, node: Obj) -> None:
        looked_at.append(pod["metadata"]["name"])
        follow(pod, node)

    monkeypatch.setattr(sim.kubelets, "_follow_node", spy)
    sim.set_marker("default", "p7", "changed")  # a store change: the loop has not run yet
    sim.kubelets.reconcile_changed()
    assert looked_at == ["p7"]
    sim.kubelets.reconcile()  # the full pass still looks at every pod
    assert len(looked_at) == 31


async def test_the_usage_kept_from_changes_is_a_recount_of_the_stored_pods() -> None:
    async with SimCluster(nodes=2, node_cpu="2", node_memory="2Gi") as sim:
        for i in range(6):
            sim.create_pod("default", f"w{i}", cpu=f"{100 * (i + 1)}m", memory="100Mi")
        await sim.wait_for(lambda: all(_phase(sim, f"w{i}") == "Running" for i in range(6)))
        sim.store.delete("pods", "default", "w2")
        sim.create_pod("default", "late", cpu="300m", node="node-2")
        await sim.wait_for(lambda: _phase(sim, "late") == "Running"
                           and sim.pod("default", "w2") is None)
        recount = scheduling.usage(sim.store.peek("pods"))
        assert sim.kubelets.usage() == recount
        assert sum(slot["pods"] for slot in recount.values()) == 6
