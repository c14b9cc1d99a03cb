"""The dashboard opens from what ``cpctl serve`` prints.

Invariants pinned: ``cpctl serve`` prints the address a browser opens, a one-time sign-in
link and where the token comes from (never the token); the pages opened without a token
show a sign-in form in place of their panels (no "missing or wrong bearer token"); a
refused token says so; the right token typed into the form, or the link, loads the
operations. The link works once; its cookie opens reads only (a POST still needs the
token). Driven end to end: a real ``cpctl serve`` process over the demo's history, a
real headless Chromium (``tests/support/browser.py``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

import aiohttp
import pytest

from controlplane.api.login import CODE_SECONDS, SESSION_SECONDS, Login
from controlplane.cli.serve import browser_url
from controlplane.store import queries
from tests.support.api_world import History
from tests.support.browser import Page, browser

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "sign-in-test-token-7c2e91d0"

HIDDEN_PANELS = ("[...document.querySelector('main').children].filter((e) => e.id !== "
                 "'sign-in').every((e) => e.hidden && e.offsetParent === null)")
FORM = ("(() => { const f = document.getElementById('sign-in'); return f && "
        "f.offsetParent !== null && document.getElementById('sign-in-note').textContent; })()")
ROWS = "document.querySelectorAll('tr.operation').length"


async def _sign_in_with(page: Page, token: str) -> None:
    await page.evaluate(f"document.getElementById('sign-in-token').value = {json.dumps(token)}")
    await page.click("#sign-in button")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_the_dashboard_opens_from_what_serve_prints(history: History, db_url: str,
                                                          tmp_path: Path) -> None:
    token_file = tmp_path / "api.token"
    token_file.write_text(TOKEN + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane.cli.main", "--db", db_url, "serve", "--listen",
        "127.0.0.1:0", "--token-file", str(token_file), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            lines = [(await proc.stdout.readline()).decode() for _ in range(3)]
        url = lines[0].removeprefix("API and dashboard on ").strip()
        assert url.startswith("http://127.0.0.1:"), lines
        assert url.endswith("/"), lines
        words = lines[1].split()
        assert words[:3] == ["sign", "in:", "open"], lines
        link = words[3]
        assert link.startswith(f"{url}login?code=")
        assert f"(--token-file {token_file})" in lines[2]
        assert "Authorization: Bearer <token>" in lines[2]
        machines = len(await queries.list_machines(history.db, queries.MachineFilter()))

        async with browser(tmp_path) as page:
            # No token: the summary's six charts give way to the form, not to six errors.
            await page.send("Page.navigate", url=f"{url}summary")
            note = await page.until(FORM, "the summary's sign-in form")
            assert "open the one-time sign-in link" in note
            assert await page.evaluate(HIDDEN_PANELS)
            assert "bearer token" not in await page.evaluate("document.body.innerText")

            await page.send("Page.navigate", url=url)
            await page.until(FORM, "the dashboard's sign-in form")
            assert await page.evaluate(HIDDEN_PANELS)
            await _sign_in_with(page, "not-the-token-at-all")
            note = await page.until(f"{FORM} && {FORM}.startsWith('The API refused')",
                                    "the refusal")
            await _sign_in_with(page, TOKEN)
            assert await page.until(f"{ROWS} === {machines} && {ROWS}",
                                    "the operations, after the token") == machines
            assert await page.evaluate("document.getElementById('sign-in') === null")
            assert TOKEN not in await page.evaluate("window.location.href")

            # A browser without the token: the printed link signs it in by a cookie.
            await page.evaluate("window.sessionStorage.clear()")
            await page.send("Page.navigate", url=link)
            assert await page.until(f"{ROWS} === {machines} && {ROWS}",
                                    "the operations, after the link") == machines
            # No script error and no CSP refusal; the browser logs each 401 it was given.
            assert [p for p in page.problems() if "status of 401" not in p] == []
            cookies = (await page.send("Network.getCookies", urls=[url]))["cookies"]
            session = {c["name"]: c for c in cookies}["controlplane_session"]
            assert (session["httpOnly"], session["sameSite"]) == (True, "Strict")

        async with aiohttp.ClientSession(cookies={"controlplane_session": session["value"]}) \
                as http:
            async with http.get(f"{url}api/v1/operations") as read:
                assert read.status == 200
            async with http.post(f"{url}api/v1/operations", json={}) as write:
                assert write.status == 401  # the cookie opens reads only
            async with http.get(link, allow_redirects=False) as again:
                assert (again.status, again.headers["Location"]) == (303, "/?signin=expired")
    finally:
        if proc.returncode is None:
            proc.terminate()
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert TOKEN not in "".join(lines) + out.decode() + err.decode()


def test_serve_prints_an_address_a_browser_can_open() -> None:
    assert browser_url("http", "0.0.0.0", 8080) == "http://127.0.0.1:8080/"
    assert browser_url("http", "::", 8080) == "http://[::1]:8080/"
    assert browser_url("https", "10.1.2.3", 443) == "https://10.1.2.3:443/"


def test_a_sign_in_link_works_once_and_its_session_ends() -> None:
    made = count()
    issued = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    login = Login(lambda: f"secret-{next(made):032d}", issued)
    code = login.code
    assert code is not None
    late = Login(lambda: f"other-{next(made):032d}", issued)
    assert late.code is not None
    assert late.redeem(late.code, issued + timedelta(seconds=CODE_SECONDS)) is None
    assert login.redeem("wrong", issued) is None
    session = login.redeem(code, issued + timedelta(minutes=1))
    assert session is not None
    assert login.code is None
    assert login.redeem(code, issued + timedelta(minutes=1)) is None  # spent
    assert login.valid(session, issued + timedelta(hours=1))
    assert not login.valid("secret-0", issued + timedelta(hours=1))
    assert not login.valid(session, issued + timedelta(minutes=1, seconds=SESSION_SECONDS))
