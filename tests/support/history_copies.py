"""Histories written once per test process, handed to each test as a fresh copy.

The API tests read the history ``cpctl demo`` writes (a checkpoint, a migration, a
suspend, a resume through the embedded simulator; with a drain for some), on SQLite and
on PostgreSQL. Writing it takes seconds, and some hundred tests ask for it: each test
process writes each history once per backend, keeps the database as a template, and
gives every later test a byte-for-byte copy in that test's own database:

- **SQLite**: the database file is copied over the test's (its engine disposed first, so
  no connection holds the old file and the WAL is folded in);
- **PostgreSQL**: the test database is dropped and created again ``TEMPLATE`` the kept one
  (a file-level copy in the server).

The test's :class:`~controlplane.store.database.Database` object stays the same; its
engine opens new connections on next use. Each copy is the test's own: a test that
writes to it changes no other test's. Used by ``tests/api/conftest.py``.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import asyncpg

from controlplane.store.database import Database

T = TypeVar("T")
_SIDE_FILES = ("-wal", "-shm", "-journal")


class HistoryCopies:
    """Per test process: the kept databases (by history name and backend) and what
    writing each returned (the ids the tests read)."""

    def __init__(self, folder: Path, pg_admin_url: str) -> None:
        self.folder = folder
        self.pg_admin_url = pg_admin_url.replace("postgresql+asyncpg", "postgresql")
        self._kept: dict[tuple[str, str], object] = {}
        self._templates: list[str] = []

    async def copy(self, name: str, db: Database, url: str,
                   write: Callable[[], Awaitable[T]]) -> T:
        """``db`` (at ``url``) holding history ``name``: written by ``write`` the first
        time, a copy of that first database after."""
        backend = "sqlite" if url.startswith("sqlite") else "postgresql"
        key = (name, backend)
        if key not in self._kept:
            result = await write()
            await db.dispose()
            await self._keep(name, url)
            self._kept[key] = result
            return result
        await db.dispose()
        await self._restore(name, url)
        kept: T = self._kept[key]  # type: ignore[assignment]
        return kept

    async def close(self) -> None:
        """Drop the kept PostgreSQL databases."""
        for template in self._templates:
            await self._admin(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')

    async def _keep(self, name: str, url: str) -> None:
        if url.startswith("sqlite"):
            await asyncio.to_thread(_copy_sqlite, Path(_sqlite_path(url)),
                                    self.folder / f"{name}.db")
            return
        database, template = _pg_name(url), f"{_pg_name(url)}_{name}"
        await self._admin(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
        await self._admin(f'CREATE DATABASE "{template}" TEMPLATE "{database}"')
        self._templates.append(template)

    async def _restore(self, name: str, url: str) -> None:
        if url.startswith("sqlite"):
            await asyncio.to_thread(_copy_sqlite, self.folder / f"{name}.db",
                                    Path(_sqlite_path(url)))
            return
        database = _pg_name(url)
        await self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await self._admin(f'CREATE DATABASE "{database}" TEMPLATE "{database}_{name}"')

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.pg_admin_url, timeout=10)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


def _copy_sqlite(source: Path, target: Path) -> None:
    """The database file and its side files (a closed WAL database has none), replacing
    whatever ``target`` had."""
    for side in ("", *_SIDE_FILES):
        Path(f"{target}{side}").unlink(missing_ok=True)
        if Path(f"{source}{side}").exists():
            shutil.copyfile(f"{source}{side}", f"{target}{side}")


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _pg_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]
