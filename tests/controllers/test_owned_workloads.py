"""Against the real kube-controller-manager and kube-scheduler: controller-owned pods are
refused by name, never half-moved; bare pods beside them still move.

The world is a kube-apiserver of its own with the real ReplicaSet, Deployment and
StatefulSet controllers and the real scheduler (``Envtest.start_controllers``), the
kubelet role binding nothing (``--no-scheduler``: it only runs the nodes' kubelets), and
the product beside it as processes (``tests/e2e/world.py``: sim-dumper agents, a worker,
``cpctl`` verbs). What the real controllers do is the judge: after each refusal the
workload has exactly its replicas, with the same pods (UIDs) as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.world import Obj, World, open_world
from tests.support.envtest import (
    NODES,
    RealCluster,
    find_real_cluster,
    running_envtest,
    start_kubelet_role,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
AFFINITY_NODE_1 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                  "operator": "In", "values": ["node-1"]}]}]}}}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.fail(f"these tests start a control plane of their own: {where}", pytrace=False)
    tmp = tmp_path_factory.mktemp("controllers")
    with running_envtest(Path(where), tmp / "envtest") as env:
        env.start_controllers()
        kubeconfig = env.write_kubeconfig(tmp / "admin.kubeconfig")
        role = start_kubelet_role(kubeconfig, NODES, tmp / "kubelets.log", "--no-scheduler")
        try:
            real = RealCluster(kubeconfig, list(NODES), env, role)
            with open_world("real", tmp, real) as w:
                yield w
        finally:
            role.stop()


def _apply(w: World, path: str, body: Obj) -> None:
    w.kube.request("POST", path, body)


def _template(app: str, *, pin: bool) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
                 "terminationGracePeriodSeconds": 1}
    if pin:
        spec["affinity"] = AFFINITY_NODE_1
    return {"metadata": {"labels": {"app": app, "e2e": "verbs"}}, "spec": spec}


def _running(w: World, app: str, count: int) -> list[Obj]:
    def ready() -> list[Obj] | None:
        pods = w.running_pods(f"app={app}")
        return pods if len(pods) == count else None
    return wait_for(ready, f"{count} running {app} pods", 120)


def _uids(pods: list[Obj]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def test_a_deployment_pod_is_refused_naming_its_replicaset_and_the_replicas_stay(
        world: World) -> None:
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/deployments", {
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": _template("web", pin=False)}})
    before = _running(w, "web", 3)
    pod = before[0]
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"  # the real controller made it
    target = next(n for n in ("node-1", "node-2", "node-3") if n != pod["spec"]["nodeName"])
    done = w.cpctl("migrate", f"{w.namespace}/{pod['metadata']['name']}", "--to", target,
                   "--repository", "localhost:5000/checkpoints", cluster=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"owned by ReplicaSet {w.namespace}/{owner['name']}" in done.stderr
    after = _running(w, "web", 3)
    assert _uids(after) == _uids(before)  # nothing deleted, nothing recreated


def test_a_statefulset_pod_is_refused_and_keeps_its_identity(world: World) -> None:
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/statefulsets", {
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db",
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": _template("db", pin=False)}})
    before = _running(w, "db", 2)
    assert sorted(p["metadata"]["name"] for p in before) == ["db-0", "db-1"]
    done = w.cpctl("suspend", f"{w.namespace}/db-1", "--repository",
                   "localhost:5000/checkpoints", cluster=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"owned by StatefulSet {w.namespace}/db" in done.stderr
    assert "scheduling gate" in done.stderr  # what moving it would need
    assert _uids(_running(w, "db", 2)) == _uids(before)


def test_a_drain_moves_the_bare_pod_and_leaves_the_replicaset_pods_with_the_reason(
        world: World) -> None:
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/replicasets", {
        "metadata": {"name": "pinned"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "pinned"}},
                 "template": _template("pinned", pin=True)}})
    owned = _running(w, "pinned", 2)
    bare = w.make_pod(w.name("bare"), "node-1", marker="n=5", labels={"app": "bare-drain"})
    plan = json.loads(w.ok("drain", "node-1", "--dry-run", "-o", "json",
                           "--repository", "localhost:5000/checkpoints"))
    assert {"pod": f"{w.namespace}/{bare['metadata']['name']}",
            "how": "bare: restored under its own name"} in plan["how"]
    assert f"owned by ReplicaSet {w.namespace}/pinned" in json.dumps(plan["refused"])
    out = w.ok("drain", "node-1", "--repository", "localhost:5000/checkpoints",
               "--wait", "--wait-seconds", "120")
    assert "drain node-1" in out
    moved = wait_for(lambda: w.running_pods("app=bare-drain") or None, "the bare pod moved")
    assert moved[0]["spec"]["nodeName"] != "node-1"
    assert moved[0]["metadata"]["name"] == bare["metadata"]["name"]  # it kept its name
    assert _uids(_running(w, "pinned", 2)) == _uids(owned)  # the ReplicaSet's pods: untouched
