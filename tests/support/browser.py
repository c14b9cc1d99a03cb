"""Headless Chromium for the dashboard and summary page tests: :data:`CHROMIUM` (Debian's,
``scripts/ensure-chromium`` installs it; a missing browser FAILS the test),
:func:`browser` (one tab driven over the DevTools protocol, a :class:`Page`), and
:func:`png_pixels` to read a screenshot back. Used by ``tests/api/test_dashboard_*browser.py``
and ``tests/api/test_summary_browser.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.waiting import eventually

CHROMIUM = Path("/usr/bin/chromium")


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, zlib.decompress(idat)


#: What Chromium answers a command sent while the tab navigates (after a click on a
#: link): the page is not there yet, so a wait asks again.
NAVIGATING = ("Inspected target navigated or closed", "Execution context was destroyed")


class PageNavigating(AssertionError):
    """A command met the tab between two pages; waits retry it (``retry_on``)."""


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
        error = reply.get("error")
        if error and any(text in error.get("message", "") for text in NAVIGATING):
            raise PageNavigating(method, error)
        assert error is None, (method, error)
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
            await eventually(holds, limit_seconds=limit, every=0.05, what=what,
                             retry_on=(PageNavigating,))
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
