"""The front door's rules on both database backends, over the embedded product (simulated
cluster, agents, registry, a worker) and an in-memory resource API that keeps the API
server's rules (``fake_resources``): one operation per resource whoever races for it, a
refusal final for its generation across restarts, a stale copy read again before anything
is created, a lost status rewritten (even when the watch overtakes the door's own write),
an operation's end shown once it settled though settling moved no version, a delete held
until the operation settles.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from controlplane.clock import SystemClock
from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject
from controlplane.frontdoor.door import FINALIZER, DoorSettings, FrontDoor
from controlplane.frontdoor.ports import Resource, StaleResource
from controlplane.machines.base.stepping import action_key
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound
from controlplane.wiring.embedded import Embedded, embedded
from controlplane.worker.actions import ActionFailure, ActionRunner, RetryPolicy
from tests.frontdoor.fake_resources import FakeResources
from tests.support.sim_access import SimAccess
from tests.support.waiting import eventually

FAST = DoorSettings(resync_seconds=5.0, mirror_seconds=0.05, status_interval=0.0,
                    retry_seconds=0.05, wait_seconds=0.1)
#: No relist during a test: what the door converges on, it reaches without one.
NO_RESYNC = dataclasses.replace(FAST, resync_seconds=3600.0)


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


def door_for(world: Embedded, db: Database, api: FakeResources, *,
             settings: DoorSettings = FAST) -> FrontDoor:
    return FrontDoor(db, default_kinds(), SimAccess(world), api, Classes(world),
                     SystemClock(), settings=settings)


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
    assert "spec.podName: pod default/ghost not found (" in refused["message"]
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


class LostAgainAfterAWrite(FakeResources):
    """Once :attr:`armed`: right after the door's next status write, the status is lost
    again, and the watch delivers that newer copy before the write's own answer is back
    (a real API server's watch and its replies travel apart)."""

    armed = False

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Resource, *,
                    status: bool = False) -> Resource:
        answer = await super().patch(kind, namespace, name, patch, status=status)
        if status and self.armed:
            self.armed = False
            self.edit_status(kind, name, None, namespace)
            await self.delivered()
        return answer


async def test_a_status_lost_while_the_door_writes_it_is_rewritten(
        world: Embedded, db: Database) -> None:
    """A write's answer is older than a copy the watch already brought: the door keeps
    the watch's copy, so it sees the status lost and writes it again (with the answer
    kept, it believed the status written and wrote nothing until a relist)."""
    api = LostAgainAfterAWrite()
    api.create("Checkpoint", "web", {"podName": "web"})
    async with running(door_for(world, db, api, settings=NO_RESYNC)):
        await eventually(status_is(api, "Checkpoint", "web", "Succeeded", "True"),
                         what="the checkpoint's status Succeeded")
        before = (api.read("Checkpoint", "web") or {})["status"]
        api.armed = True
        api.edit_status("Checkpoint", "web", None)
        await eventually(lambda: not api.armed and _timeless(
            (api.read("Checkpoint", "web") or {}).get("status")) == _timeless(before),
            what="the status rewritten after it was lost twice",
            describe=lambda: (api.read("Checkpoint", "web") or {}).get("status"))


def _timeless(status: dict[str, Any] | None) -> dict[str, Any]:
    """A status without its conditions' transition times (a rewrite stamps them anew)."""
    out = dict(status or {})
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in out.get("conditions") or []]
    return out


class EndingHeld(ActionRunner):
    """The world's actions, but one operation's last (the Kubernetes Event saying how it
    ended) waits for :attr:`release`: until then the operation has ended, at its final
    version, and its worker still holds its lease, as between a worker's commit of the
    end and its release."""

    def __init__(self, actions: ActionRunner, machine_id: str) -> None:
        super().__init__({}, RetryPolicy())
        self.actions = actions
        self.ending = action_key(machine_id, "event", "finished")
        self.release = asyncio.Event()

    async def run_all(self, actions: Sequence[Action]) -> ActionFailure | None:
        if any(a.key == self.ending for a in actions):
            await self.release.wait()
        return await self.actions.run_all(actions)


async def test_an_operation_settling_without_a_new_version_shows_how_it_ended(
        world: Embedded, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that reads an ended operation before its worker released it writes
    Progressing=True; the release settles it without a new version, and the status still
    becomes Succeeded (it stayed Progressing for good when the mirror looked at versions
    only: the flake of two tests of this file on a loaded machine)."""
    api = FakeResources()
    uid = api.create("Checkpoint", "web", {"podName": "web"})["metadata"]["uid"]
    held = EndingHeld(world.worker.actions, uid)
    monkeypatch.setattr(world.worker, "actions", held)
    try:
        async with running(door_for(world, db, api, settings=NO_RESYNC)):
            await eventually(lambda: condition(api.read("Checkpoint", "web"), "Progressing")
                             .get("reason") == "Succeeded",
                             what="the ended, unreleased operation shown as Progressing")
            ended = await queries.get_machine(db, uid)
            held.release.set()
            await eventually(status_is(api, "Checkpoint", "web", "Succeeded", "True"),
                             what="Succeeded=True once the operation settled",
                             describe=lambda: (api.read("Checkpoint", "web") or {}).get(
                                 "status"))
    finally:
        held.release.set()  # never leave the world's worker waiting at teardown
    assert ended.terminal
    assert (await queries.get_machine(db, uid)).version == ended.version


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


async def test_the_deletion_of_a_replaced_resource_keeps_its_namesake() -> None:
    """A watch may report a resource's deletion after its namesake (a new UID) arrived:
    the door forgets the key only for the deletion of the copy it holds."""
    door = FrontDoor(cast(Database, None), default_kinds(), cast(Any, None), FakeResources(),
                     cast(Any, None), SystemClock())
    old = {"kind": "Checkpoint", "metadata": {"name": "web", "namespace": "default",
                                              "uid": "old"}}
    new = {"kind": "Checkpoint", "metadata": {"name": "web", "namespace": "default",
                                              "uid": "new"}}
    door._changed("Checkpoint", None, new)
    door._changed("Checkpoint", old, None)
    assert door.seen[("Checkpoint", "default", "web")] is new
    door._changed("Checkpoint", new, None)
    assert door.seen == {}
    door.queue.shut_down()
