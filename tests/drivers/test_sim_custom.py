"""Custom resources in the simulator, as a real API server serves them.

Invariants pinned: a kind is served once its CustomResourceDefinition is created (the
CRD ``Established``; discovery names the group, its short names and categories) and
no more once the CRD is deleted (its objects gone with it); ``metadata.generation``
starts at 1 and moves only when something but metadata and status changes; the status
subresource alone writes the status; a finalizer holds a deleted object; a custom
resource takes no strategic merge patch (415); OpenAPI v3 says which group versions'
PATCH takes ``fieldValidation`` and which patch types (what ``kubectl apply`` reads); a
streaming list (``sendInitialEvents``, what ``kubectl wait`` sends) ends its initial
events with the annotated bookmark. ``cpctl sim up --crds`` reads only the CRDs of a
folder, and refuses one without any. The real server's side of the table is in
``test_sim_table.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from controlplane.cli.sim import read_crds
from controlplane.errors import UsageError
from drivers.sim import SimCluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GROUP = "/apis/checkpoint.controlplane.dev/v1alpha1"
MIGRATIONS = f"{GROUP}/namespaces/default/migrations"
MERGE = "application/merge-patch+json"


def _crd(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "deploy" / "base" / "crds" / f"{name}.yaml").read_text()))


@pytest.fixture
async def served() -> AsyncIterator[tuple[SimCluster, aiohttp.ClientSession]]:
    async with SimCluster(kubelets=False) as sim, aiohttp.ClientSession(
            base_url=sim.url, timeout=aiohttp.ClientTimeout(total=10)) as http:
        yield sim, http


async def _call(http: aiohttp.ClientSession, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json") -> tuple[int, Any]:
    async with http.request(method, path, data=None if body is None else json.dumps(body),
                            headers={"Content-Type": content_type}) as response:
        return response.status, await response.json(content_type=None)


async def test_a_kind_is_served_from_its_definitions_creation_to_its_deletion(
        served: tuple[SimCluster, aiohttp.ClientSession]) -> None:
    _, http = served
    assert (await _call(http, "GET", GROUP))[0] == 404
    code, crd = await _call(http, "POST", CRDS, _crd("migration"))
    assert code == 201
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]} == {
        "NamesAccepted": "True", "Established": "True"}
    _, groups = await _call(http, "GET", "/apis")
    assert "checkpoint.controlplane.dev" in [g["name"] for g in groups["groups"]]
    _, listed = await _call(http, "GET", GROUP)
    migrations = {r["name"]: r for r in listed["resources"]}["migrations"]
    assert (migrations["kind"], migrations["shortNames"], migrations["categories"]) == (
        "Migration", ["mig"], ["checkpointing"])
    assert "migrations/status" in {r["name"] for r in listed["resources"]}

    code, _ = await _call(http, "POST", MIGRATIONS, {
        "apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "Migration",
        "metadata": {"name": "m"}, "spec": {"podName": "web"}})
    assert code == 201
    code, _ = await _call(http, "DELETE", f"{CRDS}/migrations.checkpoint.controlplane.dev")
    assert code == 200
    assert (await _call(http, "GET", GROUP))[0] == 404
    assert (await _call(http, "GET", f"{MIGRATIONS}/m"))[0] == 404


async def test_generation_status_finalizers_and_patch_types(
        served: tuple[SimCluster, aiohttp.ClientSession]) -> None:
    _, http = served
    await _call(http, "POST", CRDS, _crd("migration"))
    code, made = await _call(http, "POST", MIGRATIONS, {
        "apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "Migration",
        "metadata": {"name": "m", "finalizers": ["checkpoint.controlplane.dev/operation"]},
        "spec": {"podName": "web"}, "status": {"phase": "Forged"}})
    assert (code, made["metadata"]["generation"], "status" in made) == (201, 1, False)

    _, done = await _call(http, "PATCH", f"{MIGRATIONS}/m/status",
                          {"status": {"phase": "Succeeded"}, "spec": {"podName": "other"}},
                          content_type=MERGE)
    assert (done["status"], done["spec"], done["metadata"]["generation"]) == (
        {"phase": "Succeeded"}, {"podName": "web"}, 1)
    _, labelled = await _call(http, "PATCH", f"{MIGRATIONS}/m",
                              {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "X"}},
                              content_type=MERGE)
    assert (labelled["metadata"]["generation"], labelled["status"]) == (1, {"phase": "Succeeded"})
    _, moved = await _call(http, "PATCH", f"{MIGRATIONS}/m",
                           {"spec": {"targetNodeName": "node-2"}}, content_type=MERGE)
    assert moved["metadata"]["generation"] == 2

    code, refused = await _call(http, "PATCH", f"{MIGRATIONS}/m", {"spec": {}},
                                content_type="application/strategic-merge-patch+json")
    assert (code, refused["reason"]) == (415, "UnsupportedMediaType")

    await _call(http, "DELETE", f"{MIGRATIONS}/m")
    _, held = await _call(http, "GET", f"{MIGRATIONS}/m")
    assert held["metadata"]["deletionTimestamp"]
    await _call(http, "PATCH", f"{MIGRATIONS}/m", {"metadata": {"finalizers": None}},
                content_type=MERGE)
    assert (await _call(http, "GET", f"{MIGRATIONS}/m"))[0] == 404


async def test_openapi_v3_tells_kubectl_to_validate_on_the_server_and_merge_patch(
        served: tuple[SimCluster, aiohttp.ClientSession]) -> None:
    _, http = served
    await _call(http, "POST", CRDS, _crd("migration"))
    _, root = await _call(http, "GET", "/openapi/v3")
    where = root["paths"]["apis/checkpoint.controlplane.dev/v1alpha1"]["serverRelativeURL"]
    assert "api/v1" in root["paths"]
    _, doc = await _call(http, "GET", where)
    patch = doc["paths"][f"{MIGRATIONS.replace('default', '{namespace}')}/{{name}}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "checkpoint.controlplane.dev", "version": "v1alpha1", "kind": "Migration"}
    assert {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}} in \
        patch["parameters"]
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    _, core = await _call(http, "GET", "/openapi/v3/api/v1")
    pods = core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in pods["requestBody"]["content"]


async def test_a_streaming_list_ends_its_initial_events_with_the_annotated_bookmark(
        served: tuple[SimCluster, aiohttp.ClientSession]) -> None:
    sim, http = served
    sim.create_pod("default", "a")
    query = "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    code, refused = await _call(http, "GET", f"/api/v1/namespaces/default/pods{query}")
    assert code == 422, refused
    async with http.get(f"/api/v1/namespaces/default/pods{query}&allowWatchBookmarks=true"
                        ) as response:
        events = [json.loads(await response.content.readline()) for _ in range(2)]
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"}


def test_sim_up_reads_only_the_definitions_of_a_folder(tmp_path: Path) -> None:
    crds = read_crds(str(ROOT / "deploy" / "base" / "crds"))
    assert sorted(c["spec"]["names"]["kind"] for c in crds) == [
        "Checkpoint", "CheckpointClass", "Drain", "Migration", "Restore", "Suspension"]
    (tmp_path / "roles.yaml").write_text("kind: ClusterRole\n")
    with pytest.raises(UsageError, match="no CustomResourceDefinition"):
        read_crds(str(tmp_path))
