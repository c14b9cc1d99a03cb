"""The simulator's node-scoped lists and watches answer as a generic field filter would.

Invariants pinned: a list with ``spec.nodeName=X`` (a node agent's relist) returns exactly
the pods on X, sorted, as filtering every pod would — the fast path that rejects other
nodes' pods first changes nothing but the cost; and ``spec.nodeName=`` (the unscheduled
pods, a scheduler's selector) names no node, so its watch is told when an unbound pod is
created and when it is bound (DELETED: it stopped matching), as on a real API server.
"""

from __future__ import annotations

from typing import Any

from drivers.sim import SimCluster, selectors


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [str(obj["metadata"]["name"]) for obj in items]


async def test_a_node_scoped_list_returns_the_pods_a_generic_filter_would(
        sim: SimCluster) -> None:
    for i in range(9):
        sim.create_pod("default", f"p{i}", node=f"node-{i % 3 + 1}")
    sim.create_pod("kube-system", "sys", node="node-2")
    sim.settle()
    everything, _ = sim.store.select("pods")
    for node in ("node-1", "node-2", "node-3", "node-9"):
        selector = selectors.parse(None, f"spec.nodeName={node}")
        assert selector.node_name == node
        for namespace in (None, "default"):
            scoped, _ = sim.store.select("pods", namespace, selector)
            expected = [o for o in everything if o["spec"].get("nodeName") == node
                        and namespace in (None, o["metadata"]["namespace"])]
            assert _names(scoped) == _names(expected)
    assert _names(sim.store.select("pods", None, selectors.parse(
        None, "spec.nodeName=node-2"))[0]) == ["p1", "p4", "p7", "sys"]


async def test_a_watch_of_unscheduled_pods_sees_one_created_and_then_bound(
        sim: SimCluster) -> None:
    unscheduled = selectors.parse(None, "spec.nodeName=")
    assert unscheduled.node_name is None  # names no node: offered every pod change
    pods = sim.store.resource("pods")
    watch = sim.hub.open(pods, None, unscheduled, resource_version=str(sim.store.rv),
                         bookmarks=False)
    sim.create_pod("default", "pending", node="node-1")  # affinity only: not bound yet
    sim.settle()  # the scheduler binds it
    seen = []
    while not watch.queue.empty():
        item = watch.queue.get_nowait()
        assert isinstance(item, dict)
        seen.append((item["type"], item["object"]["metadata"]["name"]))
    sim.hub.close(watch)
    assert seen[:1] == [("ADDED", "pending")], seen
    assert seen[-1] == ("DELETED", "pending")
