"""Who asked, through the HTTP API: with several named tokens configured, each event a
request causes (submit, retarget, cancel) records the name of the token that
authenticated it as ``token:<name>``, never the token; a drain's children record the
drain that submitted them (``drain:<drain id>``).

Every test runs on SQLite and on PostgreSQL (the ``db`` fixture).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.wiring.embedded import embedded
from tests.machines.machines_gwt import OTHER, migration_body
from tests.support.api_world import auth
from tests.support.sim_access import SimAccess
from tests.support.waiting import eventually

BOT, OPS = "bot-token-" + "b" * 16, "ops-token-" + "o" * 16
TOKENS = {"ci-bot": BOT, "ops-team": OPS}


async def _by(db: Database, machine_id: str) -> list[tuple[str, str]]:
    return [(e.type, e.worker_id) for e in await queries.history(db, machine_id)]


async def test_retarget_and_cancel_record_the_name_of_the_token_that_asked(
        db: Database) -> None:
    await submit(db, default_kinds(), kind="migration", spec=migration_body({}),
                 machine_id="mig-1", now=datetime.now(UTC))
    async with TestClient(TestServer(make_app(db, token=TOKENS))) as client:
        moved = await client.post("/api/v1/operations/mig-1/retarget", headers=auth(BOT),
                                  json={"node": OTHER})
        assert (moved.status, (await moved.json())["accepted"]) == (202, True)
        stopped = await client.post("/api/v1/operations/mig-1/cancel", headers=auth(OPS),
                                    json={})
        assert (stopped.status, (await stopped.json())["accepted"]) == (202, True)
        wrong = await client.post("/api/v1/operations/mig-1/cancel",
                                  headers=auth(BOT + "x"), json={})
        assert wrong.status == 401
        listed = await client.get("/api/v1/operations/mig-1/events", headers=auth(OPS))
        body = await listed.text()
    assert await _by(db, "mig-1") == [
        ("Submitted", "operator"), ("Retargeted", "token:ci-bot"),
        ("CancelRequested", "token:ops-team")]
    assert "token:ci-bot" in body
    assert BOT not in body
    assert OPS not in body


async def test_an_api_submit_records_its_token_and_a_drains_children_record_the_drain(
        db: Database, tmp_path: Path) -> None:
    async with embedded(db, tmp_path / "world", SystemClock()) as world:
        world.cluster.create_pod("default", "web", node="node-1", marker="n=1")
        await world.cluster.wait_for(
            lambda: ((world.cluster.pod("default", "web") or {}).get("status") or {})
            .get("phase") == "Running", what="web running")
        klass = {"repository": world.repository("checkpoints/who")}
        app = make_app(db, token=TOKENS, cluster=SimAccess(world))
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/api/v1/operations", headers=auth(OPS), json={
                "kind": "drain", "node": "node-1", "class": klass})
            assert resp.status == 201
            drain_id = (await resp.json())["id"]
        world.worker.nudge()

        async def children() -> list[str]:
            machines = await queries.list_machines(db, queries.MachineFilter())
            return [m.id for m in machines if m.id != drain_id]

        async def a_child() -> bool:
            return bool(await children())

        await eventually(a_child, limit_seconds=30, every=0.05, what="the drain's child")
        (child,) = await children()
        assert (await _by(db, drain_id))[0] == ("Submitted", "token:ops-team")
        assert (await _by(db, child))[0] == ("Submitted", f"drain:{drain_id}")
