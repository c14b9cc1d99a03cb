"""Fixtures for the API tests: a database holding a real history (the demo's flow), and a
client of the API over it. The histories and the server are built by
``tests/support/api_world.py``.

``history`` runs ``cpctl demo``'s steps (checkpoint, migration, suspend, resume) on
the embedded simulator against the ``db`` fixture, so every test runs on SQLite and on
PostgreSQL over events the real product wrote; ``drained`` adds a drain of node-1 with a
refused child.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.api.serving import RedactingAccessLogger
from controlplane.store.database import Database
from tests.support.api_world import TOKEN, DrainHistory, History, run_demo, run_drain


@pytest.fixture
async def history(db: Database, tmp_path: Path) -> History:
    return await run_demo(db, tmp_path / "world")


@pytest.fixture
async def drained(db: Database, tmp_path: Path) -> DrainHistory:
    demo = await run_demo(db, tmp_path / "demo")
    return DrainHistory(db, await run_drain(db, tmp_path / "drain"), demo.migration_id)


@pytest.fixture
async def client(history: History) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = make_app(history.db, token=TOKEN)
    server = TestServer(app)
    # As production serves it (serving.make_runner): the access log redacts ?token=.
    await server.start_server(access_log_class=RedactingAccessLogger)
    async with TestClient(server) as test_client:
        yield test_client
