"""The drain planner, pure: given a cluster, when planning a drain, then the plan never
overfills a node, spreads load, respects taints and affinity, and reports every pod it
leaves alone with a reason. Properties checked with hypothesis over random clusters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.machines.drain.planning import (
    CHECKPOINT_POLICY,
    NodeInfo,
    PlanRejected,
    PodInfo,
    Resources,
    node_info,
    plan_drain,
    pod_info,
    usage,
)

GI = 2.0**30


def node(name: str, cpu: float = 4, *, taints: tuple[dict[str, Any], ...] = (),
         labels: dict[str, str] | None = None, cordoned: bool = False,
         ready: bool = True) -> NodeInfo:
    return NodeInfo(name, ready, cordoned, labels or {}, taints, Resources(cpu, 8 * GI, 110))


def pod(name: str, cpu: float, node_name: str = "src", **kw: Any) -> PodInfo:
    return PodInfo("default", name, f"uid-{name}", node_name, requests=Resources(cpu, GI / 8, 1),
                   **kw)


def test_given_room_on_two_nodes_when_planning_then_pods_spread_over_both() -> None:
    plan = plan_drain("src", [node("src"), node("a"), node("b")],
                      [pod(f"p{i}", 1) for i in range(4)])
    targets = sorted(m.target for m in plan.moves)
    assert targets == ["a", "a", "b", "b"]
    assert plan.left == ()


def test_given_a_tainted_node_when_planning_then_only_tolerating_pods_go_there() -> None:
    taint = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
    tolerant = pod("t", 1, tolerations=({"key": "gpu", "operator": "Exists"},))
    plan = plan_drain("src", [node("src"), node("g", taints=(taint,)), node("n", cpu=1)],
                      [tolerant, pod("x", 1), pod("y", 1)])
    placed = {m.pod.name: m.target for m in plan.moves}
    assert placed["t"] in ("g", "n")
    assert "g" not in {placed.get("x"), placed.get("y")}
    [left] = plan.left
    assert "untolerated taint gpu=yes" in left.reason
    assert "Insufficient cpu" in left.reason


def test_given_required_affinity_when_planning_then_it_is_honoured_but_hostname_pins_are_not(
) -> None:
    raw = {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
           "spec": {"nodeName": "src", "containers": [{"name": "c"}], "affinity": {
               "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                   "nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In", "values": ["src"]},
                       {"key": "zone", "operator": "In", "values": ["z2"]}]}]}}}},
           "status": {"phase": "Running"}}
    plan = plan_drain("src", [node("src"), node("a", labels={"zone": "z1"}),
                              node("b", labels={"zone": "z2"})], [pod_info(raw)])
    assert [m.target for m in plan.moves] == ["b"]


def test_given_pods_that_cannot_move_then_each_is_left_with_its_reason() -> None:
    pods = [pod("never", 1, annotations={CHECKPOINT_POLICY: "never"}),
            pod("ds", 1, owner_kinds=("DaemonSet",)), pod("pending", 1, phase="Pending"),
            pod("ok", 1)]
    plan = plan_drain("src", [node("src"), node("a")], pods)
    reasons = {x.pod.name: x.reason for x in plan.left}
    assert "does not allow checkpointing" in reasons["never"]
    assert "DaemonSet" in reasons["ds"]
    assert "not Running" in reasons["pending"]
    assert [m.pod.name for m in plan.moves] == ["ok"]


def test_a_pod_whose_controller_would_recreate_it_is_left_naming_the_owner() -> None:
    owned = pod_info({"metadata": {"namespace": "default", "name": "web-1", "uid": "u1",
                                   "ownerReferences": [{"kind": "Job", "name": "web",
                                                        "controller": True}]},
                      "spec": {"nodeName": "src"}, "status": {"phase": "Running"}})
    plan = plan_drain("src", [node("src"), node("a")], [owned, pod("bare", 1)])
    [left] = plan.left
    assert "owned by Job default/web" in left.reason
    assert "a drain would leave a cold copy" in left.reason
    assert [m.pod.name for m in plan.moves] == ["bare"]


def test_replicaset_and_statefulset_pods_move_each_by_their_mechanism() -> None:
    def owned(name: str, kind: str) -> PodInfo:
        return pod_info({"metadata": {"namespace": "default", "name": name, "uid": name,
                                      "ownerReferences": [{"kind": kind, "name": "web",
                                                           "controller": True}]},
                         "spec": {"nodeName": "src"}, "status": {"phase": "Running"}})
    plan = plan_drain("src", [node("src"), node("a")],
                      [owned("rs-1", "ReplicaSet"), owned("web-0", "StatefulSet"),
                       pod("bare", 1)])
    assert plan.left == ()
    assert {m.pod.name: m.pod.moved_by for m in plan.moves} == {
        "rs-1": "adopt", "web-0": "gated", "bare": "bare"}


@pytest.mark.parametrize(("source", "targets", "selector", "fragment"), [
    ("ghost", (), None, "unknown node 'ghost'"),
    ("src", ("src",), None, "is the node being drained"),
    ("src", ("nope",), None, "unknown node 'nope'"),
    ("src", (), "app=none", "matches no pod"),
])
def test_bad_requests_are_refused(source: str, targets: tuple[str, ...], selector: str | None,
                                  fragment: str) -> None:
    with pytest.raises(PlanRejected, match=fragment):
        plan_drain(source, [node("src"), node("a")], [pod("p", 1, labels={"app": "web"})],
                   targets=targets, selector=selector)


def test_the_only_node_cannot_be_drained() -> None:
    with pytest.raises(PlanRejected, match="only node"):
        plan_drain("src", [node("src")], [pod("p", 1)])


def test_node_info_reads_readiness_cordon_taints_and_allocatable() -> None:
    info = node_info({"metadata": {"name": "n", "labels": {"a": "b"}},
                      "spec": {"unschedulable": True, "taints": [{"key": "k",
                                                                  "effect": "NoSchedule"}]},
                      "status": {"allocatable": {"cpu": "3500m", "memory": "2Gi", "pods": "10"},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})
    assert (info.ready, info.unschedulable, info.allocatable) == (
        True, True, Resources(3.5, 2 * GI, 10))


clusters = st.fixed_dictionaries({
    "targets": st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6), st.booleans()),
                        min_size=1, max_size=5),
    "pods": st.lists(st.tuples(st.integers(1, 30), st.booleans()), max_size=30),
})


def build(data: dict[str, Any]) -> tuple[list[NodeInfo], list[PodInfo]]:
    taint = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    nodes = [node("src", cpu=1000)]
    existing = []
    for i, (cpu, used, tainted) in enumerate(data["targets"]):
        nodes.append(node(f"t{i}", cpu=cpu, taints=(taint,) if tainted else ()))
        if used:
            existing.append(pod(f"filler{i}", min(used, cpu) / 2, f"t{i}"))
    tolerate = ({"key": "dedicated", "operator": "Exists"},)
    pods = [pod(f"p{j:02d}", tenths / 10, tolerations=tolerate if tolerant else ())
            for j, (tenths, tolerant) in enumerate(data["pods"])]
    return nodes, existing + pods


@settings(max_examples=200, deadline=None)
@given(clusters)
def test_property_a_plan_never_overfills_and_respects_taints(data: dict[str, Any]) -> None:
    nodes, pods = build(data)
    plan = plan_drain("src", nodes, pods)
    by_name = {n.name: n for n in nodes}
    moved = {m.pod.key for m in plan.moves}
    after = [p for p in pods if p.key not in moved and p.node != "src"] + [
        PodInfo(m.pod.namespace, m.pod.name, m.pod.uid, m.target, requests=m.pod.requests)
        for m in plan.moves]
    for name, used in usage(after).items():
        assert used.cpu <= by_name[name].allocatable.cpu + 1e-9, f"{name} overfilled"
    for m in plan.moves:
        assert m.target != "src"
        if by_name[m.target].taints:
            assert m.pod.tolerations, f"{m.pod.key} placed on a tainted node"
    assert len(plan.moves) + len(plan.left) == len([p for p in pods if p.node == "src"])


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(1, 40))
def test_property_equal_pods_on_equal_nodes_spread_evenly(targets: int, count: int) -> None:
    nodes = [node("src", cpu=1000)] + [node(f"t{i}", cpu=100) for i in range(targets)]
    plan = plan_drain("src", nodes, [pod(f"p{j:02d}", 1) for j in range(count)])
    per_node = [sum(1 for m in plan.moves if m.target == f"t{i}") for i in range(targets)]
    assert max(per_node) - min(per_node) <= 1
