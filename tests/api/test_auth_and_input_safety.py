"""Every data route needs the bearer token, and malformed or hostile query input gets a
400 naming the parameter (or an empty answer) and never changes the database."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.api.serving import redact
from controlplane.store import reports
from tests.support.api_world import TOKEN, History, auth

Client = TestClient[web.Request, web.Application]

PROTECTED = [
    ("GET", "/api/v1/operations"),
    ("GET", "/api/v1/operations/{mig}"),
    ("GET", "/api/v1/operations/{mig}/events"),
    ("POST", "/api/v1/operations/{mig}/cancel"),
    ("POST", "/api/v1/operations/{mig}/retarget"),
    ("GET", "/api/v1/reports/operations"),
    ("GET", "/metrics"),
]

INJECTION = "'; DROP TABLE events; --"


async def _event_count(history: History) -> int:
    return int((await reports.rows(history.db, "SELECT count(*) AS n FROM events"))[0]["n"])


async def test_protected_routes_refuse_missing_or_wrong_tokens(
        client: Client, history: History) -> None:
    for method, template in PROTECTED:
        path = template.format(mig=history.migration_id)
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": f"Bearer {TOKEN}x"},
                        {"Authorization": "Bearer"}):
            response = await client.request(method, path, headers=headers)
            assert response.status == 401, (method, path, headers)
            assert "bearer token" in (await response.json())["error"]


async def test_public_routes_need_no_token(client: Client) -> None:
    for path in ("/", "/healthz", "/api/v1/openapi.json"):
        assert (await client.get(path)).status == 200, path


async def test_metrics_can_be_made_public(history: History) -> None:
    app = make_app(history.db, token=TOKEN, metrics_public=True)
    async with TestClient(TestServer(app)) as c:
        assert (await c.get("/metrics")).status == 200
        assert (await c.get("/api/v1/operations")).status == 401


def test_an_empty_token_is_refused_at_construction(history: History) -> None:
    with pytest.raises(ValueError, match="token"):
        make_app(history.db, token="")


@pytest.mark.parametrize(("query", "parameter"), [
    ("limit=0", "limit"),
    ("limit=1001", "limit"),
    ("limit=-5", "limit"),
    ("limit=ten", "limit"),
    ("limit=1e3", "limit"),
    ("limit=", "limit"),
    ("kind=teleport", "kind"),
    ("kind=" + INJECTION, "kind"),
    ("phase=" + INJECTION, "phase"),
    ("phase=Succeeded%20OR%201=1", "phase"),
    ("active=yes", "active"),
    ("since=yesterday", "since"),
    ("since=" + INJECTION, "since"),
    ("order=" + INJECTION, "order"),
])
async def test_malformed_list_parameters_are_400_and_change_nothing(
        client: Client, history: History, query: str, parameter: str) -> None:
    before = await _event_count(history)
    response = await client.get(f"/api/v1/operations?{query}", headers=auth())
    assert response.status == 400, query
    body = await response.json()
    assert body["parameter"] == parameter
    assert body["error"]
    assert await _event_count(history) == before


async def test_hostile_ids_are_just_unknown_operations(
        client: Client, history: History) -> None:
    before = await _event_count(history)
    quoted = INJECTION.replace(" ", "%20").replace(";", "%3B").replace("'", "%27")
    for suffix in ("", "/events", "/cancel"):
        method = "POST" if suffix == "/cancel" else "GET"
        response = await client.request(method, f"/api/v1/operations/{quoted}{suffix}",
                                        headers=auth())
        assert response.status == 404, suffix
    response = await client.post(f"/api/v1/operations/{history.migration_id}/retarget",
                                  headers=auth(), json={"node": INJECTION})
    assert response.status in (400, 409)
    assert await _event_count(history) == before


async def test_the_token_never_reaches_the_logs(
        client: Client, history: History, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await client.get(f"/?token={TOKEN}")
    await client.get("/api/v1/operations", headers=auth())
    await client.get("/api/v1/operations", headers=auth("wrong"))
    await client.post(f"/api/v1/operations/{history.migration_id}/cancel", headers=auth())
    assert TOKEN not in caplog.text


def test_redaction_hides_token_and_keeps_other_parameters() -> None:
    assert redact("/?token=s3cret&select=abc") == "/?token=REDACTED&select=abc"
    assert redact("/api/v1/operations") == "/api/v1/operations"
    assert "s3cret" not in redact("/?select=1&TOKEN=s3cret")
