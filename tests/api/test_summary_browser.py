"""The summary page in a real headless Chromium (over the DevTools protocol): every chart
arrives from the API and is drawn inline, with visible bars inside its panel, under the
page's CSP with no script error; the token leaves the address bar; without a token the
panels give way to the sign-in form. A screenshot of it is a real image.

The history is real: ``cpctl demo``'s flow and a drain with a refused child
(``tests/api/conftest.py``'s ``drained``), on SQLite and PostgreSQL.
``SUMMARY_SCREENSHOT=<path>`` also writes the screenshot there (``docs/img/summary.png``
was made so). Chromium is required: a missing browser FAILS these tests.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.api.summary_charts import NAMES
from tests.support.api_world import TOKEN, DrainHistory, serving
from tests.support.browser import Page, PageNavigating, browser, png_pixels
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first

CHARTS = ("(() => [...document.querySelectorAll('figure[data-chart]')].map((f) => {"
          " const svg = f.querySelector('svg.chart'), box = f.getBoundingClientRect();"
          " const r = svg && svg.getBoundingClientRect();"
          " return {name: f.dataset.chart, error: f.querySelector('.error').textContent,"
          "  drawn: svg ? svg.dataset.chart : null,"
          "  empty: !!svg && svg.classList.contains('empty'),"
          "  inside: !!r && r.left >= box.left && r.right <= box.right && r.top >= box.top"
          "   && r.bottom <= box.bottom && r.width > 0 && r.height > 0,"
          "  bars: svg ? [...svg.querySelectorAll('rect.bar')].map((b) => {"
          "   const s = b.getBoundingClientRect(); return [s.width, s.height]; }) : [],"
          "  title: svg ? svg.querySelector('title').textContent : null}; }))()")


@pytest.fixture
async def base_url(drained: DrainHistory) -> AsyncIterator[str]:
    async with serving(drained.db) as url:
        yield url


async def charts_when(page: Page, done: str, what: str) -> list[dict[str, Any]]:
    """The figures, once the JS predicate ``done(figure)`` holds for every one."""
    async def settled() -> bool:
        # all the page's figures (none yet is not "all": the tab may still be blank)
        return bool(await page.evaluate(
            "(() => { const f = [...document.querySelectorAll('figure[data-chart]')];"
            f" return f.length === {len(NAMES)} && f.every({done}); }})()"))
    try:
        await eventually(settled, limit_seconds=30, every=0.05, what=what,
                         retry_on=(PageNavigating,))
    except TimeoutError:
        raise AssertionError(f"{what}: {await page.evaluate(CHARTS)}; "
                             f"problems: {page.problems()}") from None
    found: list[dict[str, Any]] = await page.evaluate(CHARTS)
    return found


async def test_every_chart_is_drawn_inside_its_panel_from_the_history(
        base_url: str, tmp_path: Path) -> None:
    async with browser(tmp_path) as page:
        await page.send("Emulation.setDeviceMetricsOverride", width=1600, height=1000,
                        deviceScaleFactor=1, mobile=False)
        await page.send("Page.navigate", url=f"{base_url}/summary?token={TOKEN}")
        charts = await charts_when(page, "(f) => f.querySelector('svg.chart')",
                                   "every chart drawn")
        assert [c["name"] for c in charts] == list(NAMES)
        assert [c["drawn"] for c in charts] == list(NAMES)
        assert [c["error"] for c in charts] == [""] * len(NAMES)
        assert [c["empty"] for c in charts] == [False] * len(NAMES)  # the history has data
        assert [c["inside"] for c in charts] == [True] * len(NAMES)  # no overflow
        for c in charts:
            assert c["bars"], c["name"]
            assert all(w > 0 and h > 0 for w, h in c["bars"]), c
        by_name = {c["name"]: c for c in charts}
        assert by_name["drain-load"]["title"].endswith(" of node-1)")
        # the drain moved two pods and one was refused: three children in its stacks
        assert await page.evaluate(
            "[...document.querySelectorAll('svg[data-chart=\"drain-load\"] rect.bar')]"
            ".reduce((n, b) => n + Number(b.dataset.value), 0)") == 3
        assert "token" not in await page.evaluate("window.location.href")
        assert await page.evaluate(
            "document.querySelector('svg[data-chart=\"operations-per-hour\"]')"
            ".getAttribute('role')") == "img"

        metrics = await page.send("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        captured = await page.send("Page.captureScreenshot", format="png",
                                   captureBeyondViewport=True,
                                   clip={"x": 0, "y": 0, "width": size["width"],
                                         "height": size["height"], "scale": 1})
        shot = tmp_path / "summary.png"
        shot.write_bytes(base64.b64decode(captured["data"]))
        assert page.problems() == []  # no CSP refusal, no exception

    if os.environ.get("SUMMARY_SCREENSHOT"):
        await asyncio.to_thread(shutil.copyfile, shot, os.environ["SUMMARY_SCREENSHOT"])
    width, _, pixels = png_pixels(shot)
    assert width == 1600
    assert len(set(pixels)) > 16  # many distinct byte values: not one flat colour


async def test_without_the_token_the_panels_give_way_to_the_sign_in_form(
        base_url: str, tmp_path: Path) -> None:
    """Not six panels of "missing or wrong bearer token" (issue 41, item 6): the form
    asking for the token (``tests/api/test_sign_in.py`` signs in through it)."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{base_url}/summary")
        await page.until("document.getElementById('sign-in')", "the sign-in form")
        charts = await page.evaluate(CHARTS)
        assert [c["drawn"] for c in charts] == [None] * len(NAMES)
        assert await page.evaluate(
            "[...document.querySelectorAll('figure[data-chart]')].every((f) => f.hidden)")


async def test_the_page_passes_the_drain_in_its_address_to_the_drain_chart(
        base_url: str, tmp_path: Path) -> None:
    """``?drain=`` reaches the drain chart (an unknown one is refused there) and no other."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{base_url}/summary?token={TOKEN}&drain=nope")
        charts = await charts_when(
            page, "(f) => f.querySelector('svg.chart') || f.querySelector('.error').textContent",
            "every panel drawn or refused")
        assert {c["name"]: c["error"] for c in charts if c["error"]} == {
            "drain-load": "drain-load: no drain 'nope'"}
        assert await page.evaluate("window.location.search") == "?drain=nope"


async def test_the_header_link_opens_the_summary_with_the_token_left_out_of_the_url(
        base_url: str, tmp_path: Path) -> None:
    """The token given to the dashboard once follows a link to the summary page (in the
    tab's sessionStorage), never in an address; and the way back works the same."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{base_url}/?token={TOKEN}")
        await page.until("document.querySelectorAll('tr.operation').length > 0",
                         "the operations listed")
        await page.click('header nav a[href="/summary"]')
        charts = await charts_when(page, "(f) => f.querySelector('svg.chart')",
                                   "every chart drawn after the link")
        assert [c["error"] for c in charts] == [""] * len(NAMES)
        assert await page.evaluate("window.location.href") == f"{base_url}/summary"
        await page.click('header nav a[href="/"]')
        await page.until("document.querySelectorAll('tr.operation').length > 0",
                         "the operations listed again")
        assert "token" not in await page.evaluate("window.location.href")
        assert page.problems() == []
