"""The dashboard as an operator keeps it open, in a real headless Chromium over the
DevTools protocol: at 1280x800 and 1920x1080 nothing overflows its panel and the page
never scrolls sideways, and no two timeline markers (with their labels) intersect, none
rotated (bounding boxes from the DOM; a test shows the check sees an overlap); a running
operation updates by itself when the database changes, without a reload; the view is in
the URL (``#/op/<id>``, filters), the token is not; keyboard alone selects an operation
and reads an event's details; the event table reads facts as ``cpctl history`` does.

Screenshots go to ``$DASHBOARD_SCREENSHOTS`` when set (docs/img/dashboard-*.png were taken
so), else to the test's tmp dir. Chromium is required: a missing browser FAILS these tests.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.why import facts_text
from controlplane.clock import SystemClock
from controlplane.engine.decider import Event
from controlplane.store import event_store, queries
from controlplane.store.database import Database
from controlplane.store.records import Projection
from tests.support.api_world import (
    TOKEN,
    History,
    add_running_migration,
    advance,
    run_demo,
    run_drain,
    serving,
)
from tests.support.browser import Page, browser, png_pixels

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first

#: Every problem the page's layout has, as text ([] when none). Rectangles are clipped by
#: the ancestors that clip (overflow not visible) below the panel, as the eye sees them.
LAYOUT_PROBLEMS = r"""(() => {
  const problems = [];
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "")
    + (e.className && typeof e.className === "string" ? "." + e.className.split(" ")[0] : "")
    + (e.dataset && e.dataset.type ? "[" + e.dataset.type + "]" : "");
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth)
    problems.push("the page scrolls sideways: " + doc.scrollWidth + " > " + doc.clientWidth);
  for (const panel of document.querySelectorAll("main > section")) {
    const p = panel.getBoundingClientRect();
    for (const e of panel.querySelectorAll("*")) {
      const r = e.getBoundingClientRect();
      if (!r.width || !r.height || e.closest("#tip")) continue;
      let left = r.left, right = r.right;
      for (let a = e.parentElement; a && a !== panel; a = a.parentElement) {
        if (getComputedStyle(a).overflowX === "visible") continue;
        const q = a.getBoundingClientRect();
        left = Math.max(left, q.left); right = Math.min(right, q.right);
      }
      if (right <= left) continue;  // clipped away entirely
      if (left < p.left - 0.5 || right > p.right + 0.5)
        problems.push(name(e) + " overflows " + panel.id + ": [" + left + ", " + right
                      + "] outside [" + p.left + ", " + p.right + "]");
    }
  }
  const meet = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom
    && b.top < a.bottom;
  for (const kind of ["#events .event-mark", "#phases .phase-bar"]) {
    const boxes = [...document.querySelectorAll(kind)].map((e) => [e, e.getBoundingClientRect()]);
    boxes.forEach(([e, r], i) => boxes.slice(i + 1).forEach(([f, s]) => {
      if (meet(r, s)) problems.push(name(e) + " intersects " + name(f));
    }));
  }
  for (const e of document.querySelectorAll("#timeline *"))
    if (getComputedStyle(e).transform !== "none" && !e.matches(".event-mark"))
      problems.push(name(e) + " is transformed (rotated text?)");
  return problems;
})()"""


@pytest.fixture
async def world(db: Database, tmp_path: Path) -> History:
    """The demo's history, then a drain of node-1 (three children, one refused)."""
    demo = await run_demo(db, tmp_path / "demo")
    await run_drain(db, tmp_path / "drain")
    return demo




@pytest.fixture
async def base_url(world: History) -> AsyncIterator[str]:
    async with serving(world.db) as url:
        yield url


@pytest.fixture
async def demo_url(history: History) -> AsyncIterator[str]:
    async with serving(history.db) as url:
        yield url


async def resize(page: Page, width: int, height: int) -> None:
    await page.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                    deviceScaleFactor=1, mobile=False)


async def timeline_drawn(page: Page, machine_id: str, db: Database) -> None:
    count = len(await queries.history(db, machine_id))
    await page.until(f"document.querySelectorAll('#events .event-mark').length === {count}"
                     f" && document.querySelectorAll('#event-rows tr').length === {count}"
                     f" && document.getElementById('selected-title').textContent"
                     f".includes({json.dumps(machine_id)})", "the timeline and its table")


async def drawn(page: Page) -> None:
    """After two animation frames: what a resize observer places has been placed."""
    await page.send("Runtime.evaluate", awaitPromise=True, expression=(
        "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"))


async def key(page: Page, name: str, code: int) -> None:
    for kind in ("rawKeyDown", "keyUp"):
        await page.send("Input.dispatchKeyEvent", type=kind, key=name, code=name,
                        windowsVirtualKeyCode=code)


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (1920, 1080)])
async def test_nothing_overflows_its_panel_and_no_timeline_labels_meet(
        base_url: str, world: History, tmp_path: Path, width: int, height: int) -> None:
    """The demo migration (the longest history) with the drain in the list, opened."""
    drain = next(m for m in await queries.list_machines(world.db, queries.MachineFilter(
        kind="drain")))
    async with browser(tmp_path) as page:
        await resize(page, width, height)
        await page.send("Page.navigate", url=f"{base_url}/?token={TOKEN}"
                                             f"#/op/{world.migration_id}")
        await timeline_drawn(page, world.migration_id, world.db)
        await page.click(f'tr.operation.drain[data-id="{drain.id}"] button.toggle')
        await page.until("document.querySelectorAll('tr.drain-children tr.child').length",
                         "the drain's children")
        await drawn(page)
        assert await page.evaluate(LAYOUT_PROBLEMS) == []
        marks = await page.evaluate("document.querySelectorAll('#events .event-mark').length")
        assert marks == len(await queries.history(world.db, world.migration_id))
        await page.evaluate("window.scrollTo(0, 0)")
        captured = await page.send("Page.captureScreenshot", format="png")
        assert page.problems() == []
    shots = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path)
    shot = shots / f"dashboard-{width}.png"
    shot.write_bytes(base64.b64decode(captured["data"]))
    got_width, got_height, pixels = png_pixels(shot)
    assert (got_width, got_height) == (width, height)
    assert len(set(pixels)) > 16  # not one flat colour


async def test_the_layout_check_sees_an_overlap_and_an_overflow(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """The check above can fail: a marker moved onto another and a too-wide element are
    both reported."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate",
                        url=f"{demo_url}/?token={TOKEN}#/op/{history.migration_id}")
        await timeline_drawn(page, history.migration_id, history.db)
        await drawn(page)
        assert await page.evaluate(LAYOUT_PROBLEMS) == []
        await page.evaluate(
            "(() => { const [a, b] = document.querySelectorAll('#events .event-mark');"
            " b.style.left = a.style.left; b.style.top = a.style.top;"
            " const wide = document.createElement('div'); wide.style.width = '5000px';"
            " wide.style.height = '1px'; document.getElementById('waiting').append(wide);"
            " })()")
        await drawn(page)
        problems = await page.evaluate(LAYOUT_PROBLEMS)
    assert any("intersects" in p for p in problems), problems
    assert any("overflows detail-panel" in p for p in problems), problems
    assert any("scrolls sideways" in p for p in problems), problems


async def test_a_running_operation_updates_by_itself_without_a_reload(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """The database changes under an open page: the selected operation's phase, what it
    waits for (as cpctl --wait says it), its new event (facts as cpctl reads them) and a
    new operation in the list all arrive, and the page was never reloaded."""
    db = history.db
    await add_running_migration(db, "live-1")
    facts: dict[str, Any] = {"pod default/live": {"pod": "default/live", "pod_phase": "Running",
                                                  "node": "node-1"}, "note": "two words"}
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{demo_url}/?token={TOKEN}#/op/live-1")
        await page.until("document.getElementById('waiting')?.textContent"
                         ".startsWith('waiting in Pending')", "the live operation")
        await page.evaluate("window.samePage = true")
        await advance(db, "live-1", "Checkpointing",
                      Event("CaptureRequested", {"reason": "asked"}, facts))
        await add_running_migration_elsewhere(db)
        await page.until("document.getElementById('selected-title')?.textContent"
                         " === 'migration live-1 \u2014 Checkpointing'", "the new phase")
        await page.until("document.getElementById('waiting')?.textContent.startsWith("
                         "'waiting in Checkpointing for the node agent to capture and push "
                         "the checkpoint, and the registry to show it (last change ')",
                         "what it waits for")
        row = await page.until(
            "(() => { const r = document.querySelector('#event-rows tr:last-child');"
            " return r && r.cells[4].textContent === 'CaptureRequested' &&"
            " [...r.cells].map((c) => c.textContent); })()", "the new event's row")
        assert row[5:8] == ["asked", facts_text(facts), "test"]
        await page.until("document.querySelector('tr.operation[data-id=\"live-1\"] td.phase')"
                         "?.textContent === 'Checkpointing'", "the list's row")
        await page.until("!!document.querySelector('tr.operation[data-id=\"live-2\"]')",
                         "the new operation in the list")
        assert await page.evaluate("window.samePage") is True  # no reload
        assert page.problems() == []


async def add_running_migration_elsewhere(db: Database) -> None:
    await event_store.create_machine(
        db, machine_id="live-2", kind="migration",
        spec={"pod": {"namespace": "default", "name": "other", "uid": "uid-other"}},
        initial=Projection("Pending", {}, False), now=SystemClock().now(), worker_id="test",
        workload="default/other", source_node="node-2")


async def test_the_view_is_in_the_url_and_the_token_is_not(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """A ``#/op/<id>`` link selects; a new fragment selects another; a filter is written
    into the fragment; the token never stays in the address bar."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate",
                        url=f"{demo_url}/?token={TOKEN}#/op/{history.migration_id}")
        await timeline_drawn(page, history.migration_id, history.db)
        href = await page.evaluate("window.location.href")
        assert TOKEN not in href
        assert href.endswith(f"/#/op/{history.migration_id}")
        await page.evaluate(f"window.location.hash = '#/op/{history.checkpoint_id}'")
        await timeline_drawn(page, history.checkpoint_id, history.db)
        assert await page.evaluate("document.querySelector('tr.selected').dataset.id") \
            == history.checkpoint_id
        await page.evaluate("(() => { const k = document.getElementById('kind');"
                            " k.value = 'migration'; k.dispatchEvent(new Event('change'));"
                            " })()")
        ids = await page.until(
            "(() => { const r = [...document.querySelectorAll('tr.operation')];"
            " return r.length === 1 && r.map((e) => e.dataset.id); })()", "the filtered list")
        assert ids == [history.migration_id]
        assert await page.evaluate("document.getElementById('count').textContent") \
            == "1\u20131 of 1 operations"
        assert await page.evaluate("window.location.hash") \
            == f"#/op/{history.checkpoint_id}?kind=migration"
        assert page.problems() == []


async def test_keyboard_alone_selects_an_operation_and_reads_an_event(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """Arrow keys move between rows, Enter opens one; a focused marker shows its event's
    reason, facts and who asked (the same tooltip as on hover)."""
    listed = [m.id for m in await queries.list_machines(history.db, queries.MachineFilter())]
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{demo_url}/?token={TOKEN}")
        await page.until(f"document.querySelectorAll('tr.operation').length === {len(listed)}",
                         "the list")
        await page.evaluate("document.querySelector('tr.operation').focus()")
        await key(page, "ArrowDown", 40)
        second = await page.evaluate("document.activeElement.dataset.id")
        assert second == listed[1]  # newest first, as the API lists them
        await key(page, "Enter", 13)
        await timeline_drawn(page, second, history.db)
        assert await page.evaluate("window.location.hash") == f"#/op/{second}"
        events = await queries.history(history.db, second)
        await page.evaluate("document.querySelector('#events .event-mark').focus()")
        await key(page, "ArrowRight", 39)
        tip = await page.until("!document.getElementById('tip').hidden &&"
                               " document.getElementById('tip').textContent", "the tooltip")
        assert tip.startswith(f"#{events[1].seq} {events[1].type} at ")
        if events[1].worker_id:
            assert f"by {events[1].worker_id}" in tip
        if events[1].facts:
            assert facts_text(events[1].facts) in tip
        await key(page, "Escape", 27)
        assert await page.evaluate("document.getElementById('tip').hidden") is True
        assert page.problems() == []


async def test_pages_follow_the_api_total_and_live_in_the_fragment(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """Two a page over the demo's four: "1-2 of 4", next shows the other two, the offset
    is in the fragment, and the first page has no "previous"."""
    listed = [m.id for m in await queries.list_machines(history.db, queries.MachineFilter())]
    rows = ("(() => { const r = [...document.querySelectorAll('tr.operation')];"
            " return r.map((e) => e.dataset.id); })()")
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{demo_url}/?token={TOKEN}#/?limit=2")
        await page.until("document.getElementById('count')?.textContent === "
                         "'1\u20132 of 4 operations'", "the first page")
        assert await page.evaluate(rows) == listed[:2]
        assert await page.evaluate("document.getElementById('prev').disabled") is True
        await page.click("#next")
        await page.until("document.getElementById('count').textContent === "
                         "'3\u20134 of 4 operations'", "the second page")
        assert await page.evaluate(rows) == listed[2:]
        assert await page.evaluate("document.getElementById('next').disabled") is True
        assert await page.evaluate("window.location.hash") == "#/?offset=2&limit=2"
        assert page.problems() == []


async def test_a_column_header_sorts_the_page_both_ways(
        demo_url: str, history: History, tmp_path: Path) -> None:
    """A header's button sorts by its column, again the other way; aria-sort says which."""
    kinds = ("[...document.querySelectorAll('tr.operation td.kind')]"
             ".map((td) => td.textContent)")
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{demo_url}/?token={TOKEN}")
        await page.until("document.querySelectorAll('tr.operation').length === 4", "the list")
        await page.click("th.col-kind button")
        await page.until("document.querySelector('th.col-kind')"
                         ".getAttribute('aria-sort') === 'ascending'", "sorted by kind")
        ascending = await page.evaluate(kinds)
        assert ascending == sorted(ascending) != await page.evaluate(
            "[...document.querySelectorAll('tr.operation td.kind')].reverse()"
            ".map((td) => td.textContent)")
        await page.click("th.col-kind button")
        await page.until("document.querySelector('th.col-kind')"
                         ".getAttribute('aria-sort') === 'descending'", "the other way")
        assert await page.evaluate(kinds) == sorted(ascending, reverse=True)
        assert await page.evaluate("window.location.hash") == "#/?sort=-kind"
        assert page.problems() == []
