"""The simulated API server speaks the core/v1 REST subset like a real one, over HTTP.

Invariants pinned: Status errors (kind, reason, code); optimistic concurrency on
resourceVersion; no-op writes do not bump versions; the status subresource ignores the
spec and the main resource the status; pod specs are immutable; UID preconditions on
DELETE; finalizers hold deletion; selectors, pages and watches (history replay, 410
after compaction, selector exits as DELETED, bookmarks) behave as in Kubernetes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from drivers.sim import SimCluster

PODS = "/api/v1/namespaces/default/pods"
SMP = "application/strategic-merge-patch+json"


class Http:
    def __init__(self, base: str, session: aiohttp.ClientSession) -> None:
        self.base, self.session = base, session

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, data=data,
                                        headers={"Content-Type": content_type}) as r:
            return r.status, await r.json()

    async def watch(self, path: str, limit: int) -> list[dict[str, Any]]:
        """Read up to ``limit`` events, or until the server ends the stream."""
        events: list[dict[str, Any]] = []
        async with self.session.get(self.base + path) as r:
            assert r.status == 200
            async for line in r.content:
                events.append(json.loads(line))
                if len(events) >= limit:
                    break
        return events


@pytest.fixture
async def http(sim: SimCluster) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield Http(sim.url, session)


def _pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}}


async def test_errors_are_status_objects_with_the_real_reasons(http: Http) -> None:
    status, body = await http.call("GET", f"{PODS}/missing")
    assert (status, body["kind"], body["reason"], body["code"]) == (404, "Status", "NotFound",
                                                                    404)
    assert body["details"] == {"name": "missing", "kind": "pods"}
    await http.call("POST", PODS, _pod("twice"))
    status, body = await http.call("POST", PODS, _pod("twice"))
    assert (status, body["reason"]) == (409, "AlreadyExists")
    status, body = await http.call("POST", "/api/v1/namespaces/nowhere/pods", _pod("x"))
    assert (status, body["reason"], body["message"]) == (404, "NotFound",
                                                         'namespaces "nowhere" not found')
    status, body = await http.call("POST", PODS, {"metadata": {"name": "bad"}, "spec": {}})
    assert (status, body["reason"]) == (422, "Invalid")
    status, body = await http.call("PATCH", f"{PODS}/twice", {}, "application/apply-patch+yaml")
    assert status == 415
    status, body = await http.call("GET", f"{PODS}?labelSelector=a+in+b")
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await http.call("POST", f"{PODS}?dryRun=Everything", _pod("dry"))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["details"]["kind"] == "CreateOptions"
    status, _ = await http.call("GET", "/api/v1/namespaces/default/widgets")
    assert status == 404


async def test_a_stale_resource_version_conflicts_and_no_op_writes_keep_it(
        http: Http) -> None:
    _, pod = await http.call("POST", PODS, _pod("versioned"))
    stale = pod["metadata"]["resourceVersion"]
    status, moved = await http.call("PATCH", f"{PODS}/versioned",
                                    {"metadata": {"labels": {"a": "1"}}}, SMP)
    assert status == 200
    assert int(moved["metadata"]["resourceVersion"]) > int(stale)
    pod["metadata"]["labels"] = {"a": "2"}
    status, body = await http.call("PUT", f"{PODS}/versioned", pod)
    assert (status, body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in body["message"]
    status, same = await http.call("PATCH", f"{PODS}/versioned",
                                   {"metadata": {"labels": {"a": "1"}}}, SMP)
    assert same["metadata"]["resourceVersion"] == moved["metadata"]["resourceVersion"]


async def test_status_and_main_resource_each_ignore_the_other_half(http: Http) -> None:
    await http.call("POST", PODS, _pod("halves"))
    _, main = await http.call("PATCH", f"{PODS}/halves",
                              {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "1"}}},
                              SMP)
    assert main["status"]["phase"] != "Failed"
    assert main["metadata"]["labels"] == {"x": "1"}
    _, sub = await http.call("PATCH", f"{PODS}/halves/status",
                             {"status": {"message": "hi"}, "metadata": {"labels": {"y": "2"}}},
                             SMP)
    assert sub["status"]["message"] == "hi"
    assert sub["metadata"]["labels"] == {"x": "1", "y": "2"}, "metadata goes through, as on " \
        "a real server"
    _, sub = await http.call("PATCH", f"{PODS}/halves/status",
                             {"spec": {"activeDeadlineSeconds": 5}}, SMP)
    assert "activeDeadlineSeconds" not in sub["spec"]


async def test_pod_specs_are_immutable_but_images(http: Http) -> None:
    await http.call("POST", PODS, _pod("frozen"))
    status, _ = await http.call("PATCH", f"{PODS}/frozen",
                                {"spec": {"containers": [{"name": "c", "image": "v2"}]}}, SMP)
    assert status == 200
    status, body = await http.call("PATCH", f"{PODS}/frozen",
                                   {"spec": {"restartPolicy": "Never"}}, SMP)
    assert (status, body["reason"]) == (422, "Invalid")


async def test_delete_honours_uid_preconditions_and_finalizers(http: Http,
                                                               sim: SimCluster) -> None:
    _, pod = await http.call("POST", PODS, _pod("held", finalizers=["test/hold"]))
    status, body = await http.call("DELETE", f"{PODS}/held", {"preconditions": {"uid": "x"}})
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on Pod "held": the UID in the precondition (x) does not '
        f'match the UID in record ({pod["metadata"]["uid"]}). The object might have been '
        "deleted and then recreated")
    assert body["details"] == {"name": "held", "kind": "Pod"}
    status, body = await http.call("DELETE", f"{PODS}/held",
                                   {"preconditions": {"uid": pod["metadata"]["uid"]},
                                    "gracePeriodSeconds": 0})
    assert status == 200
    assert body["metadata"]["deletionTimestamp"]
    assert sim.pod("default", "held") is not None, "the finalizer holds it"
    await http.call("PATCH", f"{PODS}/held", {"metadata": {"finalizers": None}},
                    "application/merge-patch+json")
    assert sim.pod("default", "held") is None


async def test_selectors_and_pages(http: Http, sim: SimCluster) -> None:
    for i in range(5):
        await http.call("POST", PODS, _pod(f"p{i}", labels={"n": str(i % 2)}))
    _, odd = await http.call("GET", f"{PODS}?labelSelector=n%3D1")
    assert [p["metadata"]["name"] for p in odd["items"]] == ["p1", "p3"]
    _, named = await http.call("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp4")
    assert [p["metadata"]["name"] for p in named["items"]] == ["p4"]
    await sim.wait_for(lambda: all((p.get("spec") or {}).get("nodeName")
                                   for p in sim.store.select("pods")[0]))
    node = sim.pod("default", "p0")["spec"]["nodeName"]  # type: ignore[index]
    _, on_node = await http.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
    assert all(p["spec"]["nodeName"] == node for p in on_node["items"])
    assert on_node["items"]
    names, token = [], ""
    while True:
        _, page = await http.call("GET", f"{PODS}?limit=2" + (f"&continue={token}" if token
                                                              else ""))
        names += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert names == ["p0", "p1", "p2", "p3", "p4"]


async def test_watch_replays_history_and_expires_after_compaction(http: Http,
                                                                  sim: SimCluster) -> None:
    start = sim.store.rv
    await http.call("POST", PODS, _pod("w1"))
    events = await http.watch(f"{PODS}?watch=1&resourceVersion={start}", limit=1)
    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("ADDED", "w1")
    sim.faults.compact()
    events = await http.watch(f"{PODS}?watch=1&resourceVersion={start}", limit=1)
    assert events[0]["type"] == "ERROR"
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")


async def test_a_watch_turns_leaving_the_selector_into_deleted(http: Http,
                                                               sim: SimCluster) -> None:
    await http.call("POST", PODS, _pod("tagged", labels={"watch": "me"}))
    rv = sim.store.rv
    await http.call("PATCH", f"{PODS}/tagged", {"metadata": {"labels": {"watch": None}}}, SMP)
    events = await http.watch(f"{PODS}?watch=1&labelSelector=watch%3Dme&resourceVersion={rv}",
                              limit=1)
    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("DELETED",
                                                                           "tagged")


async def test_a_watch_without_version_starts_with_synthetic_adds_and_ends_on_timeout(
        http: Http) -> None:
    await http.call("POST", PODS, _pod("existing"))
    events = await http.watch(f"{PODS}?watch=true&timeoutSeconds=0.05&allowWatchBookmarks=true",
                              limit=10)
    assert events[0]["type"] == "ADDED"
    assert events[-1]["type"] == "BOOKMARK"
    assert set(events[-1]["object"]["metadata"]) == {"resourceVersion"}


async def test_injected_faults_answer_the_next_requests(http: Http, sim: SimCluster) -> None:
    sim.faults.fail_next("list", code=429, times=2)
    statuses = [(await http.call("GET", PODS))[0] for _ in range(3)]
    assert statuses == [429, 429, 200]
    sim.faults.fail_next("*", code=503, resource="nodes", times=None)
    assert (await http.call("GET", "/api/v1/nodes/node-1"))[0] == 503
    assert (await http.call("GET", PODS))[0] == 200
    sim.faults.clear()
    assert (await http.call("GET", "/api/v1/nodes/node-1"))[0] == 200
    assert sim.requests["list"] == 4
    assert sim.requests["get"] == 2


async def test_deleting_a_namespace_deletes_its_pods(http: Http, sim: SimCluster) -> None:
    await http.call("POST", "/api/v1/namespaces", {"metadata": {"name": "scratch"}})
    await http.call("POST", "/api/v1/namespaces/scratch/pods", _pod("inside"))
    status, _ = await http.call("DELETE", "/api/v1/namespaces/scratch")
    assert status == 200
    assert sim.pod("scratch", "inside") is None
    assert (await http.call("GET", "/api/v1/namespaces/scratch"))[0] == 404


async def test_generate_name_and_discovery(http: Http) -> None:
    status, pod = await http.call("POST", PODS, {"metadata": {"generateName": "gen-"},
                                                 "spec": _pod("x")["spec"]})
    assert status == 201
    assert pod["metadata"]["name"].startswith("gen-")
    _, resources = await http.call("GET", "/api/v1")
    assert {"pods", "nodes", "events", "namespaces", "pods/status"} <= {
        r["name"] for r in resources["resources"]}


async def test_dry_run_answers_like_the_write_and_stores_nothing(http: Http,
                                                                sim: SimCluster) -> None:
    """``dryRun=All`` validates and answers a create, patch or delete as the real write
    would, but nothing changes: no object, no version bump, no watch event."""
    await http.call("POST", PODS, _pod("kept"))
    sim.settle()
    pod, version = sim.pod("default", "kept"), sim.store.rv
    status, created = await http.call("POST", f"{PODS}?dryRun=All", _pod("ghost"))
    assert status == 201
    assert created["metadata"]["uid"]
    assert "resourceVersion" not in created["metadata"]
    status, body = await http.call("POST", f"{PODS}?dryRun=All", _pod("Not_Valid"))
    assert (status, body["reason"]) == (422, "Invalid"), "validated all the same"
    status, patched = await http.call("PATCH", f"{PODS}/kept?dryRun=All",
                                      {"metadata": {"annotations": {"x": "1"}}}, SMP)
    assert (status, patched["metadata"]["annotations"]) == (200, {"x": "1"})
    status, _ = await http.call("DELETE", f"{PODS}/kept?dryRun=All")
    assert status == 200
    status, _ = await http.call("DELETE", f"{PODS}?dryRun=All")
    assert status == 200
    status, body = await http.call("POST", f"{PODS}/kept/eviction?dryRun=All",
                                   {"kind": "Eviction", "apiVersion": "policy/v1"})
    assert status == 201
    assert sim.pod("default", "ghost") is None
    assert sim.pod("default", "kept") == pod
    assert sim.store.rv == version


async def test_an_eviction_deletes_the_pod_with_its_delete_options(http: Http,
                                                                  sim: SimCluster) -> None:
    """``pods/NAME/eviction`` (policy/v1) answers ``201`` with a ``Success`` Status and
    deletes the pod as a DELETE with the Eviction's ``deleteOptions`` would; a missing
    pod is 404, a failed UID precondition 409, another name in the body 400."""
    _, pod = await http.call("POST", PODS, _pod("evicted"))
    eviction = {"kind": "Eviction", "apiVersion": "policy/v1",
                "metadata": {"name": "evicted"}}
    status, body = await http.call("POST", f"{PODS}/evicted/eviction",
                                   {**eviction, "metadata": {"name": "other"}})
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await http.call("POST", f"{PODS}/evicted/eviction",
                                   {**eviction, "deleteOptions": {"preconditions": {"uid": "x"}}})
    assert (status, body["reason"]) == (409, "Conflict")
    status, body = await http.call("POST", f"{PODS}/evicted/eviction", eviction)
    assert (status, body) == (201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "code": 201})
    assert sim.pod("default", "evicted") is None
    status, body = await http.call("POST", f"{PODS}/evicted/eviction", eviction)
    assert (status, body["reason"]) == (404, "NotFound")
    assert pod["metadata"]["uid"]


@pytest.mark.parametrize(("metadata", "field", "words"), [
    ({"name": "a" * 254}, "metadata.name", "must be no more than 253 characters"),
    ({"name": "Web_1"}, "metadata.name", "a lowercase RFC 1123 subdomain"),
    ({"name": "web", "labels": {"app": "x" * 64}}, "metadata.labels",
     "must be no more than 63 bytes"),
    ({"name": "web", "labels": {"bad key": "x"}}, "metadata.labels", "name part must"),
    ({"name": "web", "annotations": {"Bad_Prefix/a": "x"}}, "metadata.annotations",
     "prefix part a lowercase RFC 1123 subdomain"),
    ({"name": "web", "annotations": {"a": "x" * (256 * 1024)}}, "metadata.annotations",
     "Too long: may not be more than 262144 bytes"),
])
async def test_metadata_is_validated_in_apimachinerys_words(
        http: Http, metadata: dict[str, Any], field: str, words: str) -> None:
    """A create (and an update) with metadata a real server refuses gets ``422 Invalid``
    naming the field, in apimachinery's words; nothing is stored."""
    status, body = await http.call("POST", PODS, {
        "metadata": metadata, "spec": {"containers": [{"name": "c", "image": "pause"}]}})
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == field
    assert words in body["message"]
    if metadata["name"] == "web":
        await http.call("POST", PODS, _pod("web"))
        status, _ = await http.call("PATCH", f"{PODS}/web", {"metadata": metadata}, SMP)
        assert status == 422


async def test_strict_field_validation_refuses_unknown_fields(http: Http) -> None:
    """``fieldValidation=Strict``: an unknown field at any depth is ``400`` on a create and
    ``422`` (field ``patch``) on a patch; known fields pass; without it they are kept."""
    body = _pod("strict")
    body["spec"]["containers"][0]["imagePolicy"] = "x"
    status, out = await http.call("POST", f"{PODS}?fieldValidation=Strict", body)
    assert (status, out["reason"]) == (400, "BadRequest")
    assert 'unknown field "spec.containers[0].imagePolicy"' in out["message"]
    status, _ = await http.call("POST", f"{PODS}?fieldValidation=Strict", _pod("strict"))
    assert status == 201
    status, out = await http.call("PATCH", f"{PODS}/strict?fieldValidation=Strict",
                                  {"spec": {"tolerations": [{"key": "a", "bogus": 1}]}}, SMP)
    assert (status, out["reason"], out["details"]["causes"][0]["field"]) == (
        422, "Invalid", "patch")
    status, _ = await http.call("PATCH", f"{PODS}/strict?fieldValidation=Strict",
                                {"metadata": {"labels": {"a": "1"}}}, SMP)
    assert status == 200
    status, out = await http.call("PATCH", f"{PODS}/strict?fieldValidation=Sloppy", {}, SMP)
    assert (status, out["details"]["kind"]) == (422, "PatchOptions")


async def test_a_malformed_resource_version_is_refused_as_kube_apiserver_does(
        http: Http) -> None:
    """A LIST gets ``400 BadRequest``; a watch ``500`` with no reason (kube-apiserver does
    not classify that error)."""
    status, body = await http.call("GET", f"{PODS}?resourceVersion=abc")
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await http.call("GET", f"{PODS}?watch=1&resourceVersion=abc")
    assert status == 500
    assert "reason" not in body
    status, _ = await http.call("GET", f"{PODS}?resourceVersion=12")
    assert status == 200
