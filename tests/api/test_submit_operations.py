"""``POST /api/v1/operations``: the HTTP API submits what the CLI's verbs submit, with the
same validation, and answers with statuses that match the CLI's exit codes.

The API runs over the embedded product (simulated cluster, node agents, on-disk
registry, a worker): its ``ClusterAccess`` reads the simulator's pods and the product's
read-through observer, so each POST goes through ``app.requests`` exactly
as ``cpctl checkpoint``/``migrate`` do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.clock import SystemClock
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.wiring.embedded import Embedded, embedded
from tests.support.api_world import TOKEN, auth
from tests.support.sim_access import SimAccess
from tests.support.waiting import eventually

Client = TestClient[web.Request, web.Application]


@dataclass
class Served:
    client: Client
    world: Embedded
    db: Database

    def klass(self) -> dict[str, Any]:
        return {"repository": self.world.repository("checkpoints/api")}


@pytest.fixture
async def served(db: Database, tmp_path: Path) -> AsyncIterator[Served]:
    async with embedded(db, tmp_path / "world", SystemClock()) as world:
        world.cluster.create_pod("default", "web", node="node-1", marker="n=1")
        await world.cluster.wait_for(
            lambda: ((world.cluster.pod("default", "web") or {}).get("status") or {})
            .get("phase") == "Running", what="web running")
        app = make_app(db, token=TOKEN, cluster=SimAccess(world))
        async with TestClient(TestServer(app)) as client:
            yield Served(client, world, db)


async def test_a_checkpoint_posted_is_created_and_runs_to_success(served: Served) -> None:
    resp = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "checkpoint", "workload": "default/web", "class": served.klass()})
    assert resp.status == 201
    body = await resp.json()
    assert resp.headers["Location"] == f"/api/v1/operations/{body['id']}"
    record = await queries.get_machine(served.db, body["id"])
    assert (record.kind, record.workload) == ("checkpoint", "default/web")
    served.world.worker.nudge()

    async def succeeded() -> bool:
        return (await queries.get_machine(served.db, body["id"])).phase == "Succeeded"

    await eventually(succeeded, limit_seconds=30, every=0.05, what="checkpoint succeeded")


async def test_a_dry_run_returns_the_plan_and_writes_nothing(served: Served) -> None:
    resp = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "migration", "workload": "default/web", "targetNode": "node-2",
        "class": served.klass(), "dryRun": True})
    assert resp.status == 200
    plan = await resp.json()
    assert (plan["dry_run"], plan["refused"], plan["target_node"]) == (True, None, "node-2")
    assert await queries.list_machines(served.db, queries.MachineFilter()) == []


async def test_bad_input_is_refused_naming_the_field(served: Served) -> None:
    missing = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "migration", "workload": "default/web", "class": served.klass()})
    assert missing.status == 400
    assert (await missing.json())["parameter"] == "target_node"  # the API's spelling
    unknown = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "checkpoint", "workload": "default/nope", "class": served.klass()})
    assert unknown.status == 400
    assert "pod default/nope not found" in (await unknown.json())["error"]
    same_node = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "migration", "workload": "default/web", "targetNode": "node-1",
        "class": served.klass()})
    assert same_node.status == 400
    assert "node-1" in (await same_node.json())["error"]
    assert await queries.list_machines(served.db, queries.MachineFilter()) == []


async def test_fields_are_snake_case_as_every_output_and_camel_case_is_accepted(
        served: Served) -> None:
    """One spelling in and out (``target_node`` as ``cpctl list -o json`` prints it); the
    custom resources' camelCase is accepted too, and an error names the field as sent."""
    for target in ({"target_node": "node-2"}, {"targetNode": "node-2"}):
        resp = await served.client.post("/api/v1/operations", headers=auth(), json={
            "kind": "migration", "workload": "default/web", "class": served.klass(),
            "dry_run": True, **target})
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["target_node"] == "node-2"
    both = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "migration", "workload": "default/web", "class": served.klass(),
        "target_node": "node-2", "targetNode": "node-3"})
    assert (both.status, (await both.json())["parameter"]) == (400, "target_node")
    camel = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "migration", "workload": "default/web", "class": served.klass(),
        "targetNode": 7})
    assert (camel.status, (await camel.json())["parameter"]) == (400, "targetNode")
    assert await queries.list_machines(served.db, queries.MachineFilter()) == []


async def test_a_second_operation_on_a_busy_workload_is_a_conflict(served: Served) -> None:
    spec = {"kind": "suspend", "workload": "default/web", "class": served.klass()}
    first = await served.client.post("/api/v1/operations", headers=auth(), json=spec)
    assert first.status == 201
    second = await served.client.post("/api/v1/operations", headers=auth(), json=spec)
    assert second.status == 409
    assert "default/web" in (await second.json())["error"]
    assert len(await queries.list_machines(served.db, queries.MachineFilter())) == 1


async def test_submitting_needs_the_token(served: Served) -> None:
    resp = await served.client.post("/api/v1/operations", json={"kind": "checkpoint"})
    assert resp.status == 401


async def test_without_a_cluster_the_api_says_it_cannot_submit(db: Database) -> None:
    async with TestClient(TestServer(make_app(db, token=TOKEN))) as client:
        resp = await client.post("/api/v1/operations", headers=auth(), json={
            "kind": "checkpoint", "workload": "default/web",
            "class": {"repository": "localhost:5000/x"}})
        assert resp.status == 503
        assert "--kubeconfig" in (await resp.json())["error"]


async def test_a_drain_posted_plans_from_the_cluster_and_moves_the_nodes_pods(
    served: Served,
) -> None:
    dry = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "drain", "node": "node-1", "class": served.klass(), "dryRun": True})
    assert dry.status == 200
    plan = await dry.json()
    assert [m["pod"] for m in plan["moves"]] == ["default/web"]
    assert await queries.list_machines(served.db, queries.MachineFilter()) == []
    resp = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "drain", "node": "node-1", "class": served.klass(), "maxParallel": 2})
    assert resp.status == 201
    body = await resp.json()
    assert (body["kind"], body["moves"], body["left"]) == ("drain", 1, 0)
    record = await queries.get_machine(served.db, body["id"])
    assert (record.kind, record.spec["node"], record.spec["max_parallel"]) == (
        "drain", "node-1", 2)


async def test_a_drain_with_a_bad_parallelism_names_the_field(served: Served) -> None:
    resp = await served.client.post("/api/v1/operations", headers=auth(), json={
        "kind": "drain", "node": "node-1", "class": served.klass(), "maxParallel": 0})
    assert resp.status == 400
    assert (await resp.json())["parameter"] == "maxParallel"
