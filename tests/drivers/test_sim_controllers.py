"""The simulator's apps/v1 controllers behave like kube-controller-manager's.

Invariants pinned: a ReplicaSet keeps ``spec.replicas`` active pods it controls (adopting
matching orphans, releasing pods relabelled out of its selector, never counting a
terminating pod) and deletes its surplus in the real ranking (lowest
``pod-deletion-cost`` first); a Deployment runs its pods through a ReplicaSet named by
the template's hash; a StatefulSet creates ``<set>-<ordinal>`` in order, recreates a
deleted pod under the same name and keeps its claim; deleting an owner deletes its
dependents. ``apps/v1`` is served over HTTP with the real validation. Every scenario
runs with zero-time transitions and ``settle()``: no sleeps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drivers.sim import SimCluster
from drivers.sim.objects import Obj, meta
from drivers.sim.replicas import DELETION_COST

RS_PATH = "/apis/apps/v1/namespaces/default/replicasets"


def _template(labels: dict[str, str]) -> Obj:
    return {"metadata": {"labels": labels},
            "spec": {"containers": [{"name": "main", "image": "pause"}]}}


def _replicaset(name: str, replicas: int, labels: dict[str, str]) -> Obj:
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": _template(labels)}}


def _pods(sim: SimCluster, **labels: str) -> list[Obj]:
    return [p for p in sim.store.select("pods", "default")[0]
            if labels.items() <= (meta(p).get("labels") or {}).items()]


def _owner_uids(pod: Obj) -> list[str]:
    return [r["uid"] for r in meta(pod).get("ownerReferences") or []]


def _running_owned(sim: SimCluster, uid: str) -> list[Obj]:
    return [p for p in sim.store.select("pods", "default")[0]
            if uid in _owner_uids(p) and meta(p).get("deletionTimestamp") is None
            and p["status"].get("phase") == "Running"]


async def test_a_replicaset_creates_pods_up_to_its_replicas_and_reports_them(
        sim: SimCluster) -> None:
    rs = sim.store.create("replicasets", "default", _replicaset("web", 3, {"app": "web"}))
    sim.settle()
    pods = _running_owned(sim, meta(rs)["uid"])
    assert len(pods) == 3
    for pod in pods:
        assert meta(pod)["name"].startswith("web-")
        assert len(meta(pod)["name"]) == 9
        assert meta(pod)["generateName"] == "web-"
        assert meta(pod)["ownerReferences"] == [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
            "uid": meta(rs)["uid"], "controller": True, "blockOwnerDeletion": True}]
    status = sim.store.get("replicasets", "default", "web")["status"]
    assert status == {"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 3,
                      "availableReplicas": 3, "observedGeneration": 1,
                      "terminatingReplicas": 0}


async def test_a_replicaset_adopts_a_matching_orphan_then_deletes_the_cheapest_pod(
        sim: SimCluster) -> None:
    """The orphan makes 4 pods for 3 replicas: the one with the lowest deletion cost goes,
    whoever it is (here one of the ReplicaSet's own, not the adopted orphan)."""
    rs = sim.store.create("replicasets", "default", _replicaset("web", 3, {"app": "web"}))
    sim.settle()
    own = sorted(meta(p)["name"] for p in _running_owned(sim, meta(rs)["uid"]))
    for cost, name in zip((10, -5, 20), own, strict=True):
        sim.store.mutate("pods", "default", name, lambda p, c=cost: meta(p).setdefault(
            "annotations", {}).__setitem__(DELETION_COST, str(c)))
    # Running before it matches: a Pending pod would go first whatever its cost.
    orphan = sim.create_pod("default", "orphan", labels={"app": "later"},
                            annotations={DELETION_COST: "0"})
    sim.settle()
    sim.store.mutate("pods", "default", "orphan",
                     lambda p: meta(p)["labels"].__setitem__("app", "web"))
    sim.settle()
    adopted = sim.pod("default", "orphan")
    assert adopted is not None
    assert _owner_uids(adopted) == [meta(rs)["uid"]]
    assert meta(adopted)["uid"] == meta(orphan)["uid"]
    left = sorted(meta(p)["name"] for p in _running_owned(sim, meta(rs)["uid"]))
    assert left == sorted([own[0], own[2], "orphan"])
    assert sim.pod("default", own[1]) is None  # cost -5: deleted, and gone once it stopped


async def test_a_replicaset_releases_a_relabelled_pod_and_replaces_it(
        sim: SimCluster) -> None:
    rs = sim.store.create("replicasets", "default", _replicaset("web", 2, {"app": "web"}))
    sim.settle()
    name = sorted(meta(p)["name"] for p in _running_owned(sim, meta(rs)["uid"]))[0]

    def relabel(pod: Obj) -> None:
        meta(pod)["labels"] = {"app": "debug"}

    sim.store.mutate("pods", "default", name, relabel)
    sim.settle()
    released = sim.pod("default", name)
    assert released is not None
    assert "ownerReferences" not in meta(released)
    assert released["status"]["phase"] == "Running"  # released, not deleted
    owned = _running_owned(sim, meta(rs)["uid"])
    assert len(owned) == 2
    assert name not in {meta(p)["name"] for p in owned}


async def test_a_replicaset_never_counts_a_terminating_pod() -> None:
    """A pod being deleted (its kubelet still stopping it) is replaced at once."""
    async with SimCluster(nodes=2, stop_seconds=60) as sim:
        rs = sim.store.create("replicasets", "default", _replicaset("web", 2, {"app": "web"}))
        sim.settle()
        victim = sorted(meta(p)["name"] for p in _running_owned(sim, meta(rs)["uid"]))[0]
        sim.store.delete("pods", "default", victim)
        sim.settle()
        terminating = sim.pod("default", victim)
        assert terminating is not None
        assert meta(terminating).get("deletionTimestamp")
        assert len(_running_owned(sim, meta(rs)["uid"])) == 2
        status = sim.store.get("replicasets", "default", "web")["status"]
        assert (status["replicas"], status["terminatingReplicas"]) == (2, 1)


async def test_scaling_a_replicaset_down_deletes_unscheduled_pods_first(
        sim: SimCluster) -> None:
    rs = sim.store.create("replicasets", "default", _replicaset("web", 2, {"app": "web"}))
    sim.settle()
    sim.cordon("node-1"), sim.cordon("node-2"), sim.cordon("node-3")
    body = sim.store.get("replicasets", "default", "web")
    body["spec"]["replicas"] = 3
    sim.store.update("replicasets", "default", "web", body)
    sim.settle()
    [pending] = [p for p in _pods(sim, app="web") if not p["spec"].get("nodeName")]
    body = sim.store.get("replicasets", "default", "web")
    body["spec"]["replicas"] = 2
    sim.store.update("replicasets", "default", "web", body)
    sim.settle()
    assert sim.pod("default", meta(pending)["name"]) is None
    assert len(_running_owned(sim, meta(rs)["uid"])) == 2
    assert sim.store.get("replicasets", "default", "web")["metadata"]["generation"] == 3


async def test_a_deployment_runs_its_pods_through_a_replicaset_named_by_the_template_hash(
        sim: SimCluster) -> None:
    dep = sim.store.create("deployments", "default", {
        "metadata": {"name": "api"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                 "template": _template({"app": "api"})}})
    sim.settle()
    [rs] = sim.store.select("replicasets", "default")[0]
    hash_ = meta(rs)["labels"]["pod-template-hash"]
    assert meta(rs)["name"] == f"api-{hash_}"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "api", "pod-template-hash": hash_}
    assert meta(rs)["ownerReferences"][0]["uid"] == meta(dep)["uid"]
    pods = _running_owned(sim, meta(rs)["uid"])
    assert len(pods) == 2
    assert all(meta(p)["labels"]["pod-template-hash"] == hash_ for p in pods)
    status = sim.store.get("deployments", "default", "api")["status"]
    assert status["readyReplicas"] == 2
    assert status["updatedReplicas"] == 2

    body = sim.store.get("deployments", "default", "api")
    body["spec"]["template"]["spec"]["containers"][0]["image"] = "pause:2"
    sim.store.update("deployments", "default", "api", body)
    sim.settle()
    sets = {meta(r)["name"]: r for r in sim.store.select("replicasets", "default")[0]}
    assert len(sets) == 2
    assert sets[meta(rs)["name"]]["spec"]["replicas"] == 0
    [new] = [r for n, r in sets.items() if n != meta(rs)["name"]]
    assert meta(new)["annotations"]["deployment.kubernetes.io/revision"] == "2"
    assert meta(sim.store.get("deployments", "default", "api"))["annotations"][
        "deployment.kubernetes.io/revision"] == "2"
    assert [p["spec"]["containers"][0]["image"] for p in _running_owned(
        sim, meta(new)["uid"])] == ["pause:2", "pause:2"]
    assert _running_owned(sim, meta(rs)["uid"]) == []


def _statefulset(name: str, replicas: int, **spec: Any) -> Obj:
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "serviceName": name,
                     "selector": {"matchLabels": {"app": name}},
                     "template": _template({"app": name}),
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}], **spec}}


async def test_a_statefulset_creates_its_pods_in_order_each_after_its_predecessor_is_ready(
) -> None:
    async with SimCluster(nodes=2, start_seconds=60) as sim:
        sim.store.create("statefulsets", "default", _statefulset("db", 3))
        sim.settle()
        assert [meta(p)["name"] for p in _pods(sim, app="db")] == ["db-0"]  # not ready yet
        sim.kubelets.start_seconds = 0
        sim.settle()
    names = [meta(p)["name"] for p in _pods(sim, app="db")]
    assert names == ["db-0", "db-1", "db-2"]
    pod = sim.pod("default", "db-1")
    assert pod is not None
    assert meta(pod)["labels"]["apps.kubernetes.io/pod-index"] == "1"
    assert meta(pod)["labels"]["statefulset.kubernetes.io/pod-name"] == "db-1"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("db-1", "db")
    assert pod["spec"]["volumes"][0] == {"name": "data",
                                         "persistentVolumeClaim": {"claimName": "data-db-1"}}
    claim = sim.store.get("persistentvolumeclaims", "default", "data-db-1")
    assert meta(claim)["labels"] == {"app": "db"}


async def test_a_parallel_statefulset_creates_every_pod_at_once() -> None:
    async with SimCluster(nodes=2, start_seconds=60) as sim:
        sim.store.create("statefulsets", "default",
                         _statefulset("db", 3, podManagementPolicy="Parallel"))
        sim.settle()
        assert [meta(p)["name"] for p in _pods(sim, app="db")] == ["db-0", "db-1", "db-2"]


async def test_a_deleted_statefulset_pod_comes_back_with_its_name_a_new_uid_and_its_claim(
) -> None:
    async with SimCluster(nodes=2, stop_seconds=60) as sim:
        sim.store.create("statefulsets", "default", _statefulset("db", 2))
        sim.settle()
        before = sim.pod("default", "db-1")
        claim = sim.store.get("persistentvolumeclaims", "default", "data-db-1")
        assert before is not None
        sim.store.delete("pods", "default", "db-1")
        sim.settle()
        held = sim.pod("default", "db-1")  # terminating: blocks its own recreation
        assert held is not None
        assert meta(held)["uid"] == meta(before)["uid"]
        sim.kubelets.stop_seconds = 0
        sim.settle()
    after = sim.pod("default", "db-1")
    assert after is not None
    assert meta(after)["uid"] != meta(before)["uid"]
    assert after["status"]["phase"] == "Running"
    assert sim.store.get("persistentvolumeclaims", "default", "data-db-1")["metadata"][
        "uid"] == meta(claim)["uid"]


async def test_a_statefulset_scales_down_from_its_highest_ordinal_and_keeps_the_claims(
        sim: SimCluster) -> None:
    sim.store.create("statefulsets", "default", _statefulset("db", 3))
    sim.settle()
    body = sim.store.get("statefulsets", "default", "db")
    body["spec"]["replicas"] = 1
    sim.store.update("statefulsets", "default", "db", body)
    sim.settle()
    assert [meta(p)["name"] for p in _pods(sim, app="db")] == ["db-0"]
    assert sorted(meta(c)["name"] for c in sim.store.select(
        "persistentvolumeclaims", "default")[0]) == ["data-db-0", "data-db-1", "data-db-2"]
    status = sim.store.get("statefulsets", "default", "db")["status"]
    assert (status["replicas"], status["readyReplicas"], status["currentReplicas"],
            status["observedGeneration"]) == (1, 1, 1, 2)


async def test_deleting_an_owner_deletes_its_dependents_but_not_the_claims(
        sim: SimCluster) -> None:
    sim.store.create("deployments", "default", {
        "metadata": {"name": "api"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                 "template": _template({"app": "api"})}})
    sim.store.create("statefulsets", "default", _statefulset("db", 1))
    sim.settle()
    assert len(_pods(sim, app="api")) == 2
    sim.store.delete("deployments", "default", "api")
    sim.store.delete("statefulsets", "default", "db")
    sim.settle()
    assert sim.store.select("replicasets", "default")[0] == []
    assert _pods(sim, app="api") == []
    assert _pods(sim, app="db") == []
    assert [meta(c)["name"] for c in sim.store.select(
        "persistentvolumeclaims", "default")[0]] == ["data-db-0"]


async def test_a_dependent_with_another_owner_left_only_loses_the_dangling_reference(
        sim: SimCluster) -> None:
    rs = sim.store.create("replicasets", "default", _replicaset("web", 1, {"app": "web"}))
    keeper = sim.store.create("replicasets", "default", _replicaset("keep", 0, {"app": "k"}))
    sim.settle()
    [pod] = _pods(sim, app="web")

    def add_owner(p: Obj) -> None:
        meta(p)["ownerReferences"].append({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                           "name": "keep", "uid": meta(keeper)["uid"]})

    sim.store.mutate("pods", "default", meta(pod)["name"], add_owner)
    sim.store.delete("replicasets", "default", "web")
    sim.settle()
    left = sim.pod("default", meta(pod)["name"])
    assert left is not None
    assert _owner_uids(left) == [meta(keeper)["uid"]]
    assert meta(rs)["uid"] not in _owner_uids(left)


# --- over HTTP -----------------------------------------------------------------------------

@pytest.fixture
async def http(sim: SimCluster) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(sim.url, timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def _call(http: aiohttp.ClientSession, method: str, path: str,
                body: Any = None) -> tuple[int, Any]:
    async with http.request(method, path, data=None if body is None else json.dumps(body),
                            headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def test_apps_v1_is_discovered_and_served_under_apis(
        sim: SimCluster, http: aiohttp.ClientSession) -> None:
    _, groups = await _call(http, "GET", "/apis")
    # apiextensions.k8s.io: CustomResourceDefinitions (tests/drivers/test_sim_custom.py)
    assert [g["name"] for g in groups["groups"]] == ["apps", "apiextensions.k8s.io"]
    _, resources = await _call(http, "GET", "/apis/apps/v1")
    assert {r["name"] for r in resources["resources"]} >= {
        "deployments", "replicasets", "statefulsets", "statefulsets/status"}
    _, core = await _call(http, "GET", "/api/v1")
    assert "persistentvolumeclaims" in {r["name"] for r in core["resources"]}
    assert "deployments" not in {r["name"] for r in core["resources"]}

    code, created = await _call(http, "POST", RS_PATH, _replicaset("web", 1, {"app": "web"}))
    assert code == 201
    assert created["apiVersion"] == "apps/v1"
    assert created["metadata"]["generation"] == 1
    code, listed = await _call(http, "GET", RS_PATH)
    assert (listed["kind"], listed["apiVersion"]) == ("ReplicaSetList", "apps/v1")
    code, missing = await _call(http, "GET", f"{RS_PATH}/nope")
    assert (code, missing["message"], missing["details"]) == (
        404, 'replicasets.apps "nope" not found',
        {"name": "nope", "group": "apps", "kind": "replicasets"})
    code, _ = await _call(http, "GET", "/api/v1/namespaces/default/replicasets")
    assert code == 404


async def test_apps_v1_refuses_a_selector_that_misses_the_template_and_negative_replicas(
        http: aiohttp.ClientSession) -> None:
    body = _replicaset("web", -1, {"app": "web"})
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    code, status = await _call(http, "POST", RS_PATH, body)
    assert code == 422
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'ReplicaSet.apps "web" is invalid: [spec.replicas: Invalid value: -1: must be greater '
        'than or equal to 0, spec.template.metadata.labels: Invalid value: '
        'map[string]string{"app":"other"}: `selector` does not match template `labels`]')
    assert [c["field"] for c in status["details"]["causes"]] == [
        "spec.replicas", "spec.template.metadata.labels"]

    code, created = await _call(http, "POST", RS_PATH, _replicaset("web", 1, {"app": "web"}))
    assert code == 201
    del created["metadata"]["resourceVersion"]  # its controller may have written since
    created["spec"]["selector"] = {"matchLabels": {"app": "web", "tier": "x"}}
    created["spec"]["template"]["metadata"]["labels"]["tier"] = "x"
    code, status = await _call(http, "PUT", f"{RS_PATH}/web", created)
    assert code == 422
    assert status["details"]["causes"][0]["field"] == "spec.selector"
