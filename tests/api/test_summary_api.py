"""The summary page's routes over a real history (the demo's operations, on SQLite and
PostgreSQL): the page is served without the token and holds no data, under a CSP that
names its one script and style; every chart needs the token and is SVG drawn from the
reporting views; an unknown chart is a JSON 404."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from aiohttp import web
from aiohttp.test_utils import TestClient

from controlplane.api import summary
from controlplane.api.summary_charts import NAMES
from tests.support.api_world import auth

Client = TestClient[web.Request, web.Application]
SVG = "{http://www.w3.org/2000/svg}"


async def test_the_page_is_public_holds_no_data_and_runs_only_its_own_script(
        client: Client) -> None:
    response = await client.get("/summary")
    assert response.status == 200
    page = await response.text()
    assert page == summary.PAGE
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'sha256-" in csp
    assert "unsafe-inline" not in csp
    assert page.count("<script>") == 1
    assert [f'data-chart="{name}"' in page for name in NAMES] == [True] * len(NAMES)


async def test_charts_need_the_token(client: Client) -> None:
    response = await client.get("/api/v1/charts/operations-per-hour.svg")
    assert response.status == 401
    response = await client.get("/api/v1/charts/operations-per-hour.svg",
                                headers=auth("wrong"))
    assert response.status == 401


async def test_every_chart_is_svg_from_the_history(client: Client) -> None:
    for name in NAMES:
        response = await client.get(f"/api/v1/charts/{name}.svg", headers=auth())
        assert response.status == 200, name
        assert response.content_type == "image/svg+xml"
        root = ET.fromstring(await response.text())
        assert root.get("data-chart") == name
    # The demo ran a checkpoint, a migration, a suspend and a resume, all in one hour.
    response = await client.get("/api/v1/charts/operations-per-hour.svg", headers=auth())
    root = ET.fromstring(await response.text())
    values = {r.get("data-series"): float(r.get("data-value", "")) for r in root.iter(f"{SVG}rect")
              if r.get("class") == "bar"}
    assert values["succeeded"] >= 4
    assert "failed" not in values  # no bar for a zero segment


async def test_an_unknown_chart_or_drain_is_a_json_404(client: Client) -> None:
    response = await client.get("/api/v1/charts/nope.svg", headers=auth())
    assert response.status == 404
    assert "operations-per-hour" in (await response.json())["error"]
    response = await client.get("/api/v1/charts/drain-load.svg?drain=nope", headers=auth())
    assert response.status == 404
    assert (await response.json())["error"] == "no drain 'nope'"


async def test_the_drain_chart_says_when_there_is_no_drain(client: Client) -> None:
    response = await client.get("/api/v1/charts/drain-load.svg", headers=auth())
    root = ET.fromstring(await response.text())
    assert "empty" in (root.get("class") or "")  # the demo ran no drain
    assert root.find(f"{SVG}title").text == (  # type: ignore[union-attr]
        "Per-node load of a drain (no drain yet)")
