"""A drain on the dashboard, in a real headless Chromium driven over the DevTools protocol:
the drain's row shows its node and a children summary, its toggle opens the table of its
child migrations (as the store has them), a child's click draws that child's timeline,
child migrations in the flat list carry their drain's label, and the page runs under its
CSP with no script error. Also the two API fields the page is drawn from (``drain`` and
``parent`` in the list, ``children`` in a drain's detail).

The history is real: ``cpctl demo``'s flow, then a drain of three pods off ``node-1`` on
the embedded simulator — one of them deleted after planning, so its child is refused —
on the ``db`` fixture (SQLite and PostgreSQL). Every wait polls a condition under a
deadline. Chromium is required: a missing browser FAILS these tests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.app.drains import drain_spec
from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock, new_id
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.planning import node_info, plan_drain, pod_info
from controlplane.machines.submission import Limits
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.wiring.embedded import embedded
from tests.api.conftest import TOKEN, auth, run_demo, serving
from tests.api.test_dashboard_browser import CHROMIUM, png_pixels
from tests.support.waiting import eventually

NS = "default"
PODS = ("web-a", "web-b", "gone")  # "gone" is deleted between plan and drain: refused
clock = SystemClock()


@dataclass(frozen=True)
class DrainHistory:
    db: Database
    drain_id: str
    migration_id: str  # the demo's own migration: no drain's child


async def run_drain(db: Database, root: Path) -> str:
    """Drain node-1 (three pods, one at a time, so the rows appear in a fixed order)
    until the drain is settled."""
    async with embedded(db, root, clock, nodes=["node-1", "node-2", "node-3"],
                        limits=Limits(max_cluster=10, max_per_source_node=4)) as world:
        cluster = world.cluster
        for name in PODS:
            cluster.create_pod(NS, name, node="node-1", cpu="100m", memory="64Mi",
                               labels={"app": name})
        await cluster.wait_for(lambda: sum(
            (p.get("status") or {}).get("phase") == "Running"
            for p in cluster.store.peek("pods")) == len(PODS), what="pods running",
            limit_seconds=30)
        pods = list(cluster.store.peek("pods"))
        plan = plan_drain("node-1", [node_info(n) for n in cluster.store.peek("nodes")],
                          [pod_info(p) for p in pods])
        klass = {"repository": world.repository("checkpoints/drain"),
                 "timeouts": {"capture": 60, "restore": 60, "schedule": 30, "gc": 60}}
        spec = drain_spec(plan, pods, klass, max_parallel=1)
        cluster.store.delete("pods", NS, "gone", grace=0)
        outcome = await submit_operation(db, default_kinds(), world.submission_observer,
                                         kind="drain", spec=spec, machine_id=new_id(),
                                         now=clock.now())
        world.worker.nudge()

        async def settled() -> bool:
            r = await queries.get_machine(db, outcome.machine_id)
            return r.terminal and r.lease_owner is None and r.next_wake_at is None
        await eventually(settled, limit_seconds=90, every=0.05, what="drain settled")
    return outcome.machine_id


@pytest.fixture
async def drained(db: Database, tmp_path: Path) -> DrainHistory:
    demo = await run_demo(db, tmp_path / "demo")
    return DrainHistory(db, await run_drain(db, tmp_path / "drain"), demo.migration_id)


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


class Page:
    """One tab of a headless Chromium, over the DevTools protocol (a WebSocket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.session = ws, ""
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            future = self.waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, /, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        self.waiting[number] = future = asyncio.get_running_loop().create_future()
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        await self.ws.send_json(message)
        reply = await asyncio.wait_for(future, timeout=30)
        assert "error" not in reply, (method, reply["error"])
        result: dict[str, Any] = reply["result"]
        return result

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    async def until(self, expression: str, what: str, limit: float = 30) -> Any:
        """Poll ``expression`` in the page until it is truthy; its value."""
        value: Any = None

        async def holds() -> bool:
            nonlocal value
            value = await self.evaluate(expression)
            return bool(value)
        try:
            await eventually(holds, limit_seconds=limit, every=0.05, what=what)
        except TimeoutError:
            state = await self.evaluate("document.getElementById('selected-title').textContent"
                                        " + ' | error: ' + document.getElementById('error')"
                                        ".textContent")
            raise AssertionError(f"{what}: not within {limit}s (page: {state}; "
                                 f"problems: {self.problems()})") from None
        return value

    async def click(self, selector: str) -> None:
        """A real left click in the middle of the element (scrolled into view)."""
        x, y = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        hit = await self.evaluate(f"(() => {{ const e = document.elementFromPoint({x}, {y});"
                                  f" return !!e && e.closest({json.dumps(selector)}) !== null;"
                                  " })()")
        assert hit, f"{selector} is covered or out of view at ({x}, {y})"
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                            clickCount=1)

    def problems(self) -> list[str]:
        """Script exceptions and console errors (a CSP refusal is one). The browser's own
        ``/favicon.ico`` request is refused (401) like any unknown path: not the page's."""
        out = [json.dumps(e["params"])[:300] for e in self.events
               if e["method"] == "Runtime.exceptionThrown"]
        out += [str(e["params"]["entry"].get("text")) for e in self.events
                if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
                and not str(e["params"]["entry"].get("url", "")).endswith("/favicon.ico")]
        return out


@contextlib.asynccontextmanager
async def browser(tmp_path: Path) -> AsyncIterator[Page]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-chromium", pytrace=False)
    proc = await asyncio.create_subprocess_exec(
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}",
        "about:blank", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        endpoint = ""
        async with asyncio.timeout(60):
            while not endpoint:
                line = (await proc.stderr.readline()).decode(errors="replace")
                assert line, "chromium exited before it served DevTools"
                if line.startswith("DevTools listening on "):
                    endpoint = line.split()[-1]
        async with aiohttp.ClientSession() as http, http.ws_connect(
                endpoint, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=10)) as ws:
            page = Page(ws)
            try:
                target = await page.send("Target.createTarget", url="about:blank")
                attached = await page.send("Target.attachToTarget",
                                           targetId=target["targetId"], flatten=True)
                page.session = attached["sessionId"]
                for domain in ("Page", "Runtime", "Log"):
                    await page.send(f"{domain}.enable")
                await page.send("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                                deviceScaleFactor=1, mobile=False)
                yield page
            finally:
                page.reader.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


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
