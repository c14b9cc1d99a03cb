"""The front door's rules on both database backends, over the embedded product (simulated
cluster, agents, registry, a worker) and an in-memory resource API that keeps the API
server's rules (``fake_resources``): one operation per resource whoever races for it, a
refusal final for its generation across restarts, a stale copy read again before anything
is created, a lost status rewritten, a delete held until the operation settles.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from controlplane.clock import SystemClock
from controlplane.engine.jsonvalue import JsonObject
from controlplane.frontdoor.door import FINALIZER, DoorSettings, FrontDoor
from controlplane.frontdoor.ports import StaleResource
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound
from controlplane.wiring.embedded import Embedded, embedded
from tests.frontdoor.fake_resources import FakeResources
from tests.support.sim_access import SimAccess
from tests.support.waiting import eventually

FAST = DoorSettings(resync_seconds=5.0, mirror_seconds=0.05, status_interval=0.0,
                    retry_seconds=0.05, wait_seconds=0.1)


class Classes:
    def __init__(self, world: Embedded) -> None:
        self.world = world

    async def class_named(self, name: str) -> JsonObject | None:
        return {"repository": self.world.repository("checkpoints/frontdoor")} \
            if name == "default" else None


@pytest.fixture
async def world(db: Database, tmp_path: Path) -> AsyncIterator[Embedded]:
    async with embedded(db, tmp_path / "world", SystemClock()) as w:
        w.cluster.create_pod("default", "web", node="node-1", marker="n=1")
        await w.cluster.wait_for(
            lambda: ((w.cluster.pod("default", "web") or {}).get("status") or {})
            .get("phase") == "Running", what="web running")
        yield w


def door_for(world: Embedded, db: Database, api: FakeResources) -> FrontDoor:
    return FrontDoor(db, default_kinds(), SimAccess(world), api, Classes(world),
                     SystemClock(), settings=FAST)


@asynccontextmanager
async def running(*doors: FrontDoor) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(d.run()) for d in doors]
    try:
        yield
    finally:
        for door in doors:
            door.stop()
        await asyncio.gather(*tasks)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def status_is(api: FakeResources, kind: str, name: str, type_: str,
              value: str) -> Callable[[], bool]:
    return lambda: condition(api.read(kind, name), type_).get("status") == value


async def machine(db: Database, machine_id: str) -> Any:
    try:
        return await queries.get_machine(db, machine_id)
    except MachineNotFound:
        return None


async def test_a_checkpoint_resource_runs_to_success_and_its_status_follows(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    made = api.create("Checkpoint", "web", {"podName": "web"})
    door = door_for(world, db, api)
    async with running(door):
        await eventually(status_is(api, "Checkpoint", "web", "Succeeded", "True"))
        writes = api.status_writes
        record = await queries.get_machine(db, made["metadata"]["uid"])
        await door.reconcile(api.read("Checkpoint", "web") or {})
        assert api.status_writes == writes  # an unchanged status costs no request
    assert writes <= record.version + 1  # at most one write per transition, plus Accepted
    obj = api.read("Checkpoint", "web")
    assert obj is not None
    uid = made["metadata"]["uid"]
    assert obj["status"]["operationID"] == uid
    assert (await queries.get_machine(db, uid)).phase == obj["status"]["phase"]
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    assert condition(obj, "Accepted")["reason"] == "OperationCreated"


async def test_two_doors_racing_on_one_resource_create_one_operation(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    made = api.create("Checkpoint", "web", {"podName": "web"})
    async with running(door_for(world, db, api), door_for(world, db, api)):
        await eventually(status_is(api, "Checkpoint", "web", "Succeeded", "True"))
    history = await queries.history(db, made["metadata"]["uid"])
    assert [e.type for e in history].count("Submitted") == 1
    listed = await queries.list_machines(db, queries.MachineFilter(kind="checkpoint"))
    assert [m.id for m in listed] == [made["metadata"]["uid"]]


async def test_a_refusal_is_final_for_its_generation_even_for_a_new_worker(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    made = api.create("Migration", "ghost", {"podName": "ghost", "targetNodeName": "node-2"})
    async with running(door_for(world, db, api)):
        await eventually(status_is(api, "Migration", "ghost", "Accepted", "False"))
    refused = condition(api.read("Migration", "ghost"), "Accepted")
    assert refused["reason"] == "InvalidSpec"
    assert refused["message"].startswith("pod default/ghost not found (")
    assert refused["message"].count("kubectl get pod") == 1  # the hint, once
    world.cluster.create_pod("default", "ghost", node="node-1", marker="n=1")
    await world.cluster.wait_for(
        lambda: ((world.cluster.pod("default", "ghost") or {}).get("status") or {})
        .get("phase") == "Running", what="ghost running")
    fresh = door_for(world, db, api)  # a restart: nothing remembered but the resource
    await fresh.reconcile(api.read("Migration", "ghost") or {})
    assert await machine(db, made["metadata"]["uid"]) is None
    assert condition(api.read("Migration", "ghost"), "Accepted") == refused


async def test_deleting_a_refused_resource_releases_it(world: Embedded, db: Database) -> None:
    api = FakeResources()
    api.create("Checkpoint", "nobody", {"podName": "nobody"})
    async with running(door_for(world, db, api)):
        await eventually(status_is(api, "Checkpoint", "nobody", "Accepted", "False"))
        api.delete("Checkpoint", "nobody")
        await eventually(lambda: api.read("Checkpoint", "nobody") is None)


async def test_a_stale_copy_is_refused_before_anything_is_created(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    stale = api.create("Checkpoint", "web", {"podName": "web"})
    api.edit_status("Checkpoint", "web", {})  # someone wrote since: a newer resourceVersion
    with pytest.raises(StaleResource):
        await door_for(world, db, api).reconcile(stale)
    assert await machine(db, stale["metadata"]["uid"]) is None


async def test_a_lost_status_is_rewritten_from_the_history(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    api.create("Checkpoint", "web", {"podName": "web"})
    async with running(door_for(world, db, api)):
        await eventually(status_is(api, "Checkpoint", "web", "Succeeded", "True"))
        before = (api.read("Checkpoint", "web") or {})["status"]
        api.edit_status("Checkpoint", "web", None)
        await eventually(lambda: _timeless((api.read("Checkpoint", "web") or {}).get(
            "status")) == _timeless(before))


def _timeless(status: dict[str, Any] | None) -> dict[str, Any]:
    """A status without its conditions' transition times (a rewrite stamps them anew)."""
    out = dict(status or {})
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in out.get("conditions") or []]
    return out


async def test_a_delete_waits_for_the_operation_to_settle_and_keeps_its_history(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    made = api.create("Migration", "web", {"podName": "web", "targetNodeName": "node-2"})
    uid = made["metadata"]["uid"]
    async with running(door_for(world, db, api)):
        await eventually(lambda: (api.read("Migration", "web") or {}).get(
            "metadata", {}).get("finalizers") == [FINALIZER])
        api.delete("Migration", "web")
        await eventually(lambda: api.read("Migration", "web") is None, limit_seconds=90)
    record = await queries.get_machine(db, uid)
    assert record.terminal
    assert await queries.history(db, uid)


async def test_a_restore_applied_with_its_checkpoint_waits_for_it_then_runs(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    api.create("Restore", "copy", {"checkpointName": "web", "nodeName": "node-2",
                                   "podName": "copy"})
    door = door_for(world, db, api)
    async with running(door):
        await eventually(lambda: condition(api.read("Restore", "copy"), "Accepted").get(
            "reason") == "CheckpointNotFound")
        api.create("Checkpoint", "web", {"podName": "web"})
        await eventually(status_is(api, "Restore", "copy", "Succeeded", "True"),
                         limit_seconds=90)
    pod = world.cluster.pod("default", "copy")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "node-2"


async def test_a_resume_the_operation_refuses_shows_beside_the_suspension(
        world: Embedded, db: Database) -> None:
    api = FakeResources()
    api.create("Suspension", "web", {"podName": "web", "operatingMode": "Running",
                                     "resumeNodeName": "node-9"})
    async with running(door_for(world, db, api)):
        await eventually(lambda: condition(api.read("Suspension", "web"),
                                           "CommandRefused").get("reason") == "ResumeRefused",
                         limit_seconds=90)
    obj = api.read("Suspension", "web") or {}
    assert obj["status"]["phase"] == "Suspended"
    assert condition(obj, "Succeeded")["status"] == "True"
    assert "node-9" in condition(obj, "CommandRefused")["message"]
    assert "resumeOperationID" not in obj["status"]
