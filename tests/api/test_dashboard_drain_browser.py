"""A drain on the dashboard, in a real headless Chromium driven over the DevTools protocol:
the drain's row shows its node and a children summary, its toggle opens the table of its
child migrations (as the store has them), a child's click draws that child's timeline,
child migrations in the flat list carry their drain's label, and the page runs under its
CSP with no script error. Also the two API fields the page is drawn from (``drain`` and
``parent`` in the list, ``children`` in a drain's detail).

The history is real: ``cpctl demo``'s flow, then a drain of three pods off ``node-1`` on
the embedded simulator — one of them deleted after planning, so its child is refused —
on the ``db`` fixture (SQLite and PostgreSQL): ``tests/api/conftest.py``'s ``drained``.
Every wait polls a condition under a deadline. Chromium is required: a missing browser
FAILS these tests.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.store import queries
from tests.support.api_world import NS, TOKEN, DrainHistory, auth, serving
from tests.support.browser import browser, png_pixels

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first


async def drain_children(h: DrainHistory) -> list[dict[str, Any]]:
    """The drain's children as its state in the store has them."""
    children = (await queries.get_machine(h.db, h.drain_id)).state["children"]
    assert isinstance(children, list)
    return [c for c in children if isinstance(c, dict)]


# -- the API the group is drawn from ----------------------------------------------------

async def test_the_list_labels_children_and_a_drain_lists_them_with_outcomes(
        drained: DrainHistory) -> None:
    """``parent`` is set on exactly the drain's children; ``drain`` counts them as the
    drain's state does; the detail's ``children`` follow the plan, with each outcome."""
    server = TestServer(make_app(drained.db, token=TOKEN))
    async with TestClient(server) as client:
        listed = await (await client.get("/api/v1/operations", headers=auth())).json()
        detail = await (await client.get(f"/api/v1/operations/{drained.drain_id}",
                                         headers=auth())).json()
    ops = {op["id"]: op for op in listed["operations"]}
    state = await drain_children(drained)
    started = {str(c["id"]) for c in state if c["status"] == "Finished"}
    assert len(started) == 2
    assert {i for i, op in ops.items() if op["parent"]} == started
    assert {op["parent"] for op in ops.values() if op["parent"]} == {drained.drain_id}
    assert ops[drained.migration_id]["parent"] is None
    assert ops[drained.drain_id]["drain"] == {
        "node": "node-1", "children": 3, "succeeded": 2, "failed": 1, "running": 0,
        "pending": 0, "skipped": 0}
    assert "drain" not in ops[drained.migration_id]
    assert [(c["id"], c["pod"], c["target"], c["status"], c["phase"])
            for c in detail["children"]] == [
        (c["id"], f"{NS}/{c['name']}", c["target"], c["status"], c["phase"] or None)
        for c in state]
    [refused] = [c for c in detail["children"] if c["status"] == "Refused"]
    assert refused["pod"] == f"{NS}/gone"
    assert refused["reason"]
    assert "children" not in ops[drained.drain_id]  # the list stays light


# -- the page, in Chromium --------------------------------------------------------------

@pytest.fixture
async def base_url(drained: DrainHistory) -> AsyncIterator[str]:
    async with serving(drained.db) as url:
        yield url


async def test_a_drain_is_a_group_whose_children_open_their_timelines(
        base_url: str, drained: DrainHistory, tmp_path: Path) -> None:
    """The drain row summarises its children; opened, it lists each child as the store
    has it; a child's click draws the child's own timeline; a screenshot is an image."""
    drain = f'tr.operation.drain[data-id="{drained.drain_id}"]'
    state = await drain_children(drained)
    async with browser(tmp_path) as page:
        await page.send("Page.navigate", url=f"{base_url}/?token={TOKEN}")
        row = await page.until(
            f"(() => {{ const r = document.querySelector('{drain}'); return r &&"
            " [...r.cells].map((c) => c.textContent); })()", "the drain's row")
        assert row[1:4] == ["Failed", "2/3 moved, 1 failed", "node-1"]
        flat = await page.evaluate(
            "[...document.querySelectorAll('tr.operation')].map((r) => [r.dataset.id,"
            " r.dataset.parent || null, r.classList.contains('in-drain'),"
            " (r.querySelector('.parent-label') || {}).textContent || null])")
        labelled = {i: (p, indented, label) for i, p, indented, label in flat if p}
        assert set(labelled) == {str(c["id"]) for c in state if c["status"] == "Finished"}
        assert set(labelled.values()) == {
            (drained.drain_id, True, f"drain {drained.drain_id[:8]}")}
        assert [p for i, p, _, _ in flat if i == drained.migration_id] == [None]
        assert await page.evaluate("document.querySelector('tr.drain-children')") is None

        await page.click(f"{drain} button.toggle")
        children = await page.until(
            f"(() => {{ const rows = document.querySelectorAll("
            f"'tr.drain-children[data-drain=\"{drained.drain_id}\"] tr.child');"
            " return rows.length && [...rows].map((r) => [r.dataset.id,"
            " ...[...r.cells].map((c) => c.textContent)]); })()", "the drain's children")
        assert [c[:5] for c in children] == [
            [c["id"], "…" + str(c["id"])[-12:], f"{NS}/{c['name']}", c["target"],
             c["phase"] or c["status"]] for c in state]
        assert [c[5] != "" for c in children] == [c["status"] == "Refused" for c in state]

        child = next(str(c["id"]) for c in state if c["phase"] == "Succeeded")
        await page.click(f'tr.child[data-id="{child}"] td')  # its id cell
        await page.until(f"document.getElementById('selected-title').textContent"
                         f".startsWith('migration {child} — Succeeded')", "child's timeline")
        events = [e.type for e in await queries.history(drained.db, child)]
        marks = await page.until(
            "(() => { const m = [...document.querySelectorAll('#events .event-mark')]"
            ".map((e) => e.dataset.type);"
            f" return m.length === {len(events)} && m; }})()", "the child's event marks")
        assert marks == events
        bars = await page.evaluate("[...document.querySelectorAll('.phase-bar')]"
                                   ".map((b) => b.dataset.phase)")
        assert len(bars) >= 3
        assert bars[-1] == "Succeeded"
        assert await page.evaluate(  # still open, the clicked child marked
            "document.querySelector('tr.child.selected').dataset.id") == child
        assert await page.evaluate("document.getElementById('error').textContent") == ""

        shot = tmp_path / "drain.png"
        captured = await page.send("Page.captureScreenshot", format="png")
        shot.write_bytes(base64.b64decode(captured["data"]))
        assert page.problems() == []
    assert shot.stat().st_size > 20_000
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (1280, 900)
    assert len(set(pixels)) > 16  # many distinct byte values: not one flat colour


async def test_selecting_a_drain_by_url_opens_its_group(
        base_url: str, drained: DrainHistory, tmp_path: Path) -> None:
    """``select=<drain id>`` draws the drain's timeline and lists its children."""
    async with browser(tmp_path) as page:
        await page.send("Page.navigate",
                        url=f"{base_url}/?token={TOKEN}&select={drained.drain_id}")
        count = await page.until("document.querySelectorAll('tr.drain-children tr.child')"
                                 ".length", "the drain's children")
        assert count == 3
        title = await page.until("document.querySelector('#events .event-mark') &&"
                                 " document.getElementById('selected-title').textContent",
                                 "the drain's timeline")
        assert title == f"drain {drained.drain_id} — Failed"
        assert await page.evaluate(  # Refused children have no machine: not clickable
            "[...document.querySelectorAll('tr.child')].filter((r) =>"
            " r.classList.contains('clickable')).map((r) => r.dataset.status)"
        ) == ["Finished", "Finished"]
        assert page.problems() == []
