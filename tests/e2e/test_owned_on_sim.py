"""The fast suite's ReplicaSet migration: the simulator's ReplicaSet controller (which
adopts matching orphans and scales away the cheapest pod, as the real one does:
tests/drivers/test_sim_controllers_vs_real.py) and the product as processes. The real
controllers run the same scenario in tests/controllers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drivers.sim import MARKER
from tests.e2e.world import NODES, Obj, World, open_world
from tests.support.podwatch import PodWatch
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with open_world("sim", tmp_path_factory.mktemp("owned-sim"), None) as w:
        yield w


def test_a_replicaset_pod_migrates_by_adoption_on_the_simulator(world: World) -> None:
    w = world
    w.kube.request("POST", f"/apis/apps/v1/namespaces/{w.namespace}/replicasets", {
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web", "e2e": "verbs"}},
                              "spec": {"containers": [{"name": "main", "image": "pause"}],
                                       "terminationGracePeriodSeconds": 1}}}})
    before = wait_for(lambda: _three(w), "3 running web pods")
    pod = before[0]
    name = pod["metadata"]["name"]
    w.kube.request("PATCH", f"/api/v1/namespaces/{w.namespace}/pods/{name}",
                   {"metadata": {"annotations": {MARKER: "n=3"}}},
                   "application/merge-patch+json")
    target = next(n for n in NODES if n != pod["spec"]["nodeName"])
    with PodWatch(w) as watch:
        out = w.ok("migrate", f"{w.namespace}/{name}", "--to", target, "--wait",
                   "--wait-seconds", "60", "--repository", "localhost:5000/checkpoints")
        after = wait_for(lambda: _three(w, without=name), "3 running web pods, the source gone")
    assert "Succeeded" in out, out
    [moved] = [p for p in after if p["metadata"]["uid"] not in
               {b["metadata"]["uid"] for b in before}]
    assert moved["spec"]["nodeName"] == target
    assert moved["metadata"]["annotations"][MARKER] == "n=3"
    assert moved["metadata"]["ownerReferences"][0]["name"] == "web"
    assert watch.created("web") == {moved["metadata"]["uid"]}
    assert watch.most_running_with(MARKER, "n=3") == 1


def _three(w: World, *, without: str = "") -> list[Obj] | None:
    pods = w.running_pods("app=web")
    names = {p["metadata"]["name"] for p in pods}
    return pods if len(pods) == 3 and without not in names else None
