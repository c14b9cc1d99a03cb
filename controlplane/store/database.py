"""Open the database: the embedded SQLite file or PostgreSQL, from one URL.

SQLite (the embedded default) runs in WAL mode with every write going through ONE
connection that opens its transactions with ``BEGIN IMMEDIATE``: writers queue on that
connection in-process and on SQLite's lock across processes, so a transaction never
upgrades from read to write halfway (the source of SQLITE_BUSY deadlocks). Reads use a
separate small pool. PostgreSQL uses asyncpg and one pool for both.

JSON columns (states, events, recorded observations) are encoded and decoded with
``orjson`` on both backends: every transition writes a state, its events and the
observation it decided on, and every claim reads a state back, so the JSON codec is a
large share of a worker's CPU per transition (``bench.scale`` reports that figure).

Called by the CLI, the worker runtime and tests; everything else receives a
:class:`Database`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from controlplane.errors import UsageError

Backend = Literal["sqlite", "postgresql"]


def json_dumps(value: Any) -> str:
    """JSON text for a column (orjson; also used by the batched PostgreSQL statements)."""
    # Non-string keys become strings, as with the stdlib encoder the columns held before.
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


JSON_CODEC: dict[str, Any] = {"json_serializer": json_dumps,
                              "json_deserializer": orjson.loads}

def normalise_url(raw: str) -> tuple[Backend, URL]:
    """Parse a user-given URL into a backend and an async-driver URL, or explain the fix."""
    hint = "use sqlite:///path/to/file.db or postgresql://user@host:5432/dbname"
    try:
        url = make_url(raw)
    except ArgumentError:
        raise UsageError(f"database URL {raw!r} is not a URL", hint=hint) from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise UsageError(
                f"database URL {raw!r} names no file",
                hint="the control plane needs a durable file: sqlite:///var/controlplane.db",
            )
        return "sqlite", url.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        if not url.database:
            raise UsageError(f"database URL {raw!r} names no database", hint=hint)
        return "postgresql", url.set(drivername="postgresql+asyncpg")
    raise UsageError(f"database URL {raw!r} uses unsupported backend {backend!r}", hint=hint)


@dataclass
class Database:
    """The engines of one backend. ``writer`` for transactions that write, ``reader`` else."""

    backend: Backend
    url: URL
    writer: AsyncEngine
    reader: AsyncEngine

    @property
    def display_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    async def dispose(self) -> None:
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()


def open_database(raw_url: str, *, pool_size: int = 10, connect_timeout: float = 10.0) -> Database:
    """Create engines for ``raw_url`` (no connection is made until first use)."""
    backend, url = normalise_url(raw_url)
    if backend == "sqlite":
        assert url.database is not None
        directory = os.path.dirname(os.path.abspath(url.database))
        os.makedirs(directory, exist_ok=True)
        writer = _sqlite_engine(url, pool_size=1, begin="BEGIN IMMEDIATE")
        reader = _sqlite_engine(url, pool_size=4, begin="BEGIN")
        return Database("sqlite", url, writer, reader)
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"timeout": connect_timeout, "command_timeout": 60},
        **JSON_CODEC,
    )
    return Database("postgresql", url, engine, engine)


def _sqlite_engine(url: URL, *, pool_size: int, begin: str) -> AsyncEngine:
    engine = create_async_engine(
        url, pool_size=pool_size, max_overflow=0, connect_args={"timeout": 30}, **JSON_CODEC
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver so that BEGIN is ours (below).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed transition survives power loss, not just a process crash.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)

    return engine
