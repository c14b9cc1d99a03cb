"""Fixtures for the API tests: a database holding a real history (the demo's flow).

``history_db`` runs ``cpctl demo``'s steps (checkpoint, migration, suspend, resume) on
the embedded simulator against the ``db`` fixture, so every test runs on SQLite and on
PostgreSQL over events the real product wrote.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.api.serving import RedactingAccessLogger, make_runner
from controlplane.cli.demo import Demo
from controlplane.clock import SystemClock
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.wiring.embedded import embedded

TOKEN = "test-token-5f1c9a"


@dataclass(frozen=True)
class History:
    db: Database
    migration_id: str
    checkpoint_id: str


async def run_demo(db: Database, root: Path) -> History:
    async with embedded(db, root, SystemClock()) as world:
        await Demo(db, world, time.monotonic()).run()
    machines = await queries.list_machines(db, queries.MachineFilter())
    by_kind = {m.kind: m.id for m in machines}
    return History(db, by_kind["migration"], by_kind["checkpoint"])


@pytest.fixture
async def history(db: Database, tmp_path: Path) -> History:
    return await run_demo(db, tmp_path / "world")


@pytest.fixture
async def client(history: History) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = make_app(history.db, token=TOKEN)
    server = TestServer(app)
    # As production serves it (serving.make_runner): the access log redacts ?token=.
    await server.start_server(access_log_class=RedactingAccessLogger)
    async with TestClient(server) as test_client:
        yield test_client


@contextlib.asynccontextmanager
async def serving(db: Database) -> AsyncIterator[str]:
    """The API over ``db`` on a free loopback port, as ``cpctl serve`` runs it; its URL."""
    runner = make_runner(make_app(db, token=TOKEN))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
