"""The JSON API over a real history: listing, filters, one operation, its events, and
the commands (cancel, retarget) going through the deciders' validation."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.support.api_world import History, auth

Client = TestClient[web.Request, web.Application]


async def test_list_returns_every_demo_operation_newest_first(client: Client) -> None:
    response = await client.get("/api/v1/operations", headers=auth())
    assert response.status == 200
    ops = (await response.json())["operations"]
    assert sorted(op["kind"] for op in ops) == ["checkpoint", "migration", "resume", "suspend"]
    created = [op["created_at"] for op in ops]
    assert created == sorted(created, reverse=True)


async def test_list_filters_by_kind_phase_active_and_limit(client: Client) -> None:
    async def ids(query: str) -> list[str]:
        response = await client.get(f"/api/v1/operations?{query}", headers=auth())
        assert response.status == 200, await response.text()
        return [op["kind"] for op in (await response.json())["operations"]]

    assert await ids("kind=migration") == ["migration"]
    assert sorted(await ids("phase=Succeeded")) == ["checkpoint", "migration"]
    assert await ids("active=true") == []
    assert len(await ids("active=false")) == 4
    assert len(await ids("limit=2")) == 2
    assert await ids("since=2999-01-01T00:00:00Z") == []
    assert await ids("phase=NoSuchPhase") == []


async def test_get_operation_returns_spec_state_and_unknown_is_404(
        client: Client, history: History) -> None:
    response = await client.get(f"/api/v1/operations/{history.migration_id}", headers=auth())
    assert response.status == 200
    op = await response.json()
    assert (op["kind"], op["phase"], op["terminal"]) == ("migration", "Succeeded", True)
    assert op["spec"]["target_node"] == "node-2"
    missing = await client.get("/api/v1/operations/no-such-id", headers=auth())
    assert missing.status == 404
    assert "no-such-id" in (await missing.json())["error"]
    missing = await client.get("/api/v1/operations/no-such-id/events", headers=auth())
    assert missing.status == 404


async def test_events_are_in_seq_order_with_the_phase_after_each(
        client: Client, history: History) -> None:
    response = await client.get(f"/api/v1/operations/{history.migration_id}/events",
                                headers=auth())
    assert response.status == 200
    events = (await response.json())["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "Submitted"
    assert events[-1]["phase"] == "Succeeded"
    assert all(e["phase"] for e in events)
    assert len({e["phase"] for e in events}) >= 3  # a migration passes several phases


async def test_cancel_of_a_finished_operation_is_refused_with_the_reason(
        client: Client, history: History) -> None:
    response = await client.post(f"/api/v1/operations/{history.migration_id}/cancel",
                                 headers=auth())
    assert response.status == 409
    error = (await response.json())["error"]
    assert "Cancel refused" in error
    assert "already Succeeded" in error
    missing = await client.post("/api/v1/operations/nope/cancel", headers=auth())
    assert missing.status == 404


async def test_retarget_of_a_finished_migration_is_refused(
        client: Client, history: History) -> None:
    response = await client.post(f"/api/v1/operations/{history.migration_id}/retarget",
                                 headers=auth(), json={"node": "node-3"})
    assert response.status == 409
    assert "Retarget refused" in (await response.json())["error"]


async def test_retarget_body_is_validated_before_the_machine_sees_it(
        client: Client, history: History) -> None:
    path = f"/api/v1/operations/{history.migration_id}/retarget"
    cases: list[tuple[bytes, str]] = [
        (b"{not json", "body"),
        (b"[]", "body"),
        (b'"node-2"', "body"),
        (b"{}", "node"),
        (b'{"node": 3}', "node"),
        (b'{"node": null}', "node"),
        (b'{"node": ""}', "node"),
        (b'{"node": "node-2", "force": true}', "force"),
    ]
    for body, parameter in cases:
        response = await client.post(path, data=body, headers={
            **auth(), "Content-Type": "application/json"})
        assert response.status == 400, body
        assert (await response.json())["parameter"] == parameter, body


async def test_cancel_rejects_unknown_fields(client: Client, history: History) -> None:
    response = await client.post(f"/api/v1/operations/{history.migration_id}/cancel",
                                 headers=auth(), json={"now": True})
    assert response.status == 400
    assert (await response.json())["parameter"] == "now"


async def test_oversized_bodies_are_refused(client: Client, history: History) -> None:
    response = await client.post(f"/api/v1/operations/{history.migration_id}/retarget",
                                 headers=auth(), data=b'{"node": "' + b"x" * 70_000 + b'"}')
    assert response.status == 413


async def test_reports_group_operations_and_checkpoints(client: Client) -> None:
    response = await client.get("/api/v1/reports/operations?by=kind", headers=auth())
    assert response.status == 200
    rows = (await response.json())["rows"]
    assert {r["kind"] for r in rows} == {"checkpoint", "migration", "resume", "suspend"}
    assert all(r["success_rate"] == 1.0 for r in rows)
    for by in ("node", "day"):
        response = await client.get(f"/api/v1/reports/checkpoints?by={by}", headers=auth())
        assert response.status == 200
        assert sum(r["count"] for r in (await response.json())["rows"]) >= 3
    assert (await client.get("/api/v1/reports/other", headers=auth())).status == 404
    bad = await client.get("/api/v1/reports/operations?by=workload", headers=auth())
    assert bad.status == 400
    assert (await bad.json())["parameter"] == "by"
