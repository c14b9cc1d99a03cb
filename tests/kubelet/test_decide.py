"""The role's decisions, pure: given pods and nodes, which binds, refusals, starts and
finishes are due. The scheduling and running rules are the simulator's own."""

from __future__ import annotations

from drivers.kube.client import KubeObject
from drivers.kubelet.decide import Bind, Finish, Refuse, Start, decide, key

OURS = ("node-1", "node-2")


def _node(name: str, *, cpu: str = "4", ready: bool = True) -> KubeObject:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}


def _pod(name: str, *, node: str = "", cpu: str | None = None, phase: str = "Pending",
         deleting: bool = False, grace: int = 30, **spec: object) -> KubeObject:
    container: KubeObject = {"name": "main", "image": "pause"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    meta: KubeObject = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if deleting:
        meta.update(deletionTimestamp="2026-01-01T00:00:00Z", deletionGracePeriodSeconds=grace)
    body: KubeObject = {"metadata": meta, "spec": {"containers": [container], **spec},
                        "status": {"phase": phase}}
    if node:
        body["spec"]["nodeName"] = node
    return body


def _decide(pods: list[KubeObject], nodes: list[KubeObject], *,
            assumed: dict[str, str] | None = None) -> list[object]:
    return list(decide(pods, nodes, ours=OURS, assumed=assumed or {}, start_seconds=2.0,
                       stop_seconds=5.0))


def test_pending_pods_are_bound_least_allocated_first_within_one_pass() -> None:
    """Two 3-CPU pods never land on one 4-CPU node, even before the watch shows either."""
    nodes = [_node("node-1"), _node("node-2")]
    actions = _decide([_pod("a", cpu="3"), _pod("b", cpu="3")], nodes)
    assert actions == [Bind(_pod("a", cpu="3"), "node-1"), Bind(_pod("b", cpu="3"), "node-2")]


def test_an_assumed_binding_counts_and_is_not_sent_again() -> None:
    nodes = [_node("node-1"), _node("node-2", cpu="1")]
    actions = _decide([_pod("a", cpu="3"), _pod("b", cpu="3")], nodes,
                      assumed={"uid-a": "node-1"})
    assert [type(a) for a in actions] == [Refuse]
    assert "Insufficient cpu" in actions[0].message  # type: ignore[attr-defined]


def test_a_refusal_already_recorded_is_not_written_again() -> None:
    pod = _pod("a", nodeSelector={"zone": "nowhere"})
    (refusal,) = _decide([pod], [_node("node-1")])
    assert isinstance(refusal, Refuse)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                    "reason": "Unschedulable", "message": refusal.message}]
    assert _decide([pod], [_node("node-1")]) == []


def test_gated_other_schedulers_and_deleting_pods_are_not_scheduled() -> None:
    pods = [_pod("gated", schedulingGates=[{"name": "wait"}]),
            _pod("other", schedulerName="someone-else"), _pod("dying", deleting=True)]
    assert _decide(pods, [_node("node-1")]) == []


def test_bound_pods_start_only_on_our_nodes_and_finish_after_the_shorter_delay() -> None:
    nodes = [_node("node-1"), _node("node-3")]
    pods = [_pod("mine", node="node-1"), _pod("theirs", node="node-3"),
            _pod("running", node="node-1", phase="Running"),
            _pod("quick", node="node-1", deleting=True, grace=1),
            _pod("slow", node="node-1", deleting=True, grace=30)]
    actions = _decide(pods, nodes)
    assert actions == [Start(pods[0], nodes[0], 2.0), Finish(pods[3], 1),
                       Finish(pods[4], 5.0)]


def test_a_refusal_with_a_new_reason_is_a_new_write() -> None:
    pod = _pod("a", cpu="100")
    (first,) = _decide([pod], [_node("node-1")])
    (second,) = _decide([pod], [_node("node-1"), _node("node-2")])
    assert isinstance(first, Refuse)
    assert isinstance(second, Refuse)
    assert key(first) != key(second)
