"""Fixtures for the API tests: a database holding a real history (the demo's flow), and a
client of the API over it. The histories and the server are built by
``tests/support/api_world.py``.

``history`` runs ``cpctl demo``'s steps (checkpoint, migration, suspend, resume) on
the embedded simulator against the ``db`` fixture, so every test runs on SQLite and on
PostgreSQL over events the real product wrote; ``drained`` adds a drain of node-1 with a
refused child. Each test process writes each once per backend and gives every test a
copy in its own database (``tests/support/history_copies.py``): the same events, seconds
sooner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.api.app import make_app
from controlplane.api.serving import RedactingAccessLogger
from controlplane.store.database import Database
from tests.conftest import PG_ADMIN_URL
from tests.support.api_world import TOKEN, DrainHistory, History, run_demo, run_drain
from tests.support.history_copies import HistoryCopies


@pytest.fixture(scope="session")
def history_copies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryCopies]:
    copies = HistoryCopies(tmp_path_factory.mktemp("histories"), PG_ADMIN_URL)
    yield copies
    asyncio.run(copies.close())


@pytest.fixture
async def history(db: Database, db_url: str, tmp_path: Path,
                  history_copies: HistoryCopies) -> History:
    ids = await history_copies.copy("demo", db, db_url, lambda: _demo_ids(db, tmp_path))
    return History(db, *ids)


@pytest.fixture
async def drained(db: Database, db_url: str, tmp_path: Path,
                  history_copies: HistoryCopies) -> DrainHistory:
    async def write() -> tuple[str, str]:
        demo = await run_demo(db, tmp_path / "demo")
        return await run_drain(db, tmp_path / "drain"), demo.migration_id

    return DrainHistory(db, *await history_copies.copy("drain", db, db_url, write))


async def _demo_ids(db: Database, tmp_path: Path) -> tuple[str, str]:
    demo = await run_demo(db, tmp_path / "world")
    return demo.migration_id, demo.checkpoint_id


@pytest.fixture
async def client(history: History) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = make_app(history.db, token=TOKEN)
    server = TestServer(app)
    # As production serves it (serving.make_runner): the access log redacts ?token=.
    await server.start_server(access_log_class=RedactingAccessLogger)
    async with TestClient(server) as test_client:
        yield test_client
