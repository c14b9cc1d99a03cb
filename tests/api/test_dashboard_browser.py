"""The dashboard in a real headless Chromium: the page lists the operations and draws
the selected migration's timeline (phase bars, event marks named by type) from the API,
and a screenshot of it is a real, non-blank image.

Chromium is required: a missing browser FAILS these tests (run scripts/ensure-chromium).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.store import queries
from tests.support.api_world import TOKEN, History, serving
from tests.support.browser import CHROMIUM, png_pixels

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000")


@pytest.fixture
async def base_url(history: History) -> AsyncIterator[str]:
    async with serving(history.db) as url:
        yield url


async def chromium(tmp_path: Path, *args: str) -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-chromium", pytrace=False)
    proc = await asyncio.create_subprocess_exec(
        str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


async def test_dashboard_renders_operations_and_the_migration_timeline(
        base_url: str, history: History, tmp_path: Path) -> None:
    dom = await chromium(tmp_path, "--dump-dom",
                         f"{base_url}/?token={TOKEN}&select={history.migration_id}")
    rows = re.findall(r'<tr class="operation[^"]*" data-id="([^"]+)"', dom)
    assert sorted(rows) == sorted(m.id for m in await queries.list_machines(
        history.db, queries.MachineFilter()))
    assert f'data-id="{history.migration_id}"' in dom
    assert "migration " + history.migration_id in dom  # the timeline's title
    events = await queries.history(history.db, history.migration_id)
    marks = re.findall(r'class="event-mark"[^>]*data-type="([^"]+)"', dom)
    assert marks == [e.type for e in events]
    bars = re.findall(r'class="phase-bar"[^>]*data-phase="([^"]+)"', dom)
    assert len(bars) >= 3
    assert bars[-1] == "Succeeded"
    assert "CaptureRequested" in dom
    assert "ArtifactVerified" in dom
    assert 'id="error" role="alert"></div>' in dom  # no API error shown


async def test_dashboard_without_token_shows_the_api_refusal(
        base_url: str, tmp_path: Path) -> None:
    dom = await chromium(tmp_path, "--dump-dom", f"{base_url}/")
    assert "missing or wrong bearer token" in dom
    assert 'class="operation' not in dom


async def test_dashboard_screenshot_is_a_real_image(
        base_url: str, history: History, tmp_path: Path) -> None:
    shot = tmp_path / "dash.png"
    await chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900",
                   f"{base_url}/?token={TOKEN}&select={history.migration_id}")
    assert shot.stat().st_size > 20_000
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (1280, 900)
    assert len(set(pixels)) > 16  # many distinct byte values: not one flat colour
