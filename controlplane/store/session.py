"""Transactions and the translation of driver errors into the store's typed errors.

Every public store call opens its transaction here, so a refused connection, a missing
table or a unique-key race comes out as :mod:`controlplane.store.errors`, chained from
the driver's exception, never as a raw traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store.database import Database
from controlplane.store.errors import ConcurrencyConflict, DatabaseUnavailable, SchemaNotReady


def _is_schema_behind(text: str) -> bool:
    """A missing table or column: the schema is absent or older than this code."""
    if "no such table" in text or "no such column" in text:  # SQLite
        return True
    if "undefinedtable" in text or "undefinedcolumn" in text:  # asyncpg class names
        return True
    return ("relation" in text or "column" in text) and "does not exist" in text


@asynccontextmanager
async def write_txn(db: Database) -> AsyncIterator[AsyncConnection]:
    """A write transaction (SQLite: ``BEGIN IMMEDIATE`` on the single writer)."""
    async with translate_errors(db), db.writer.begin() as conn:
        yield conn


@asynccontextmanager
async def read_txn(db: Database) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction."""
    async with translate_errors(db), db.reader.connect() as conn:
        yield conn


@asynccontextmanager
async def translate_errors(db: Database) -> AsyncIterator[None]:
    try:
        yield
    except IntegrityError as exc:
        raise ConcurrencyConflict(
            "another writer appended to this machine first",
            hint="decide again on fresh state",
        ) from exc
    except (OperationalError, InterfaceError, DBAPIError) as exc:
        text = str(exc).lower()
        if _is_schema_behind(text):
            raise SchemaNotReady(
                f"the database at {db.display_url} lacks this version's schema "
                f"({_first_line(exc)})",
                hint="run `cpctl db upgrade` first",
            ) from exc
        if _sqlstate(exc, _NO_DATABASE):
            raise DatabaseUnavailable(
                f"the database at {db.display_url} does not exist ({_first_line(exc)})",
                hint="create it (`createdb NAME`, or `CREATE DATABASE NAME` in psql) and "
                     "run `cpctl db upgrade`, or name an existing one with --db / "
                     "CONTROLPLANE_DATABASE_URL",
            ) from exc
        # Any other driver error on a live connection is a bug (bad data, bad SQL): surface it.
        transient = isinstance(exc, (OperationalError, InterfaceError)) or _server_gone(exc)
        if not transient and not exc.connection_invalidated:
            raise
        raise DatabaseUnavailable(
            f"cannot use the database at {db.display_url}: {_first_line(exc)}",
            hint="check that it is running and that CONTROLPLANE_DATABASE_URL / --db is right",
        ) from exc
    except (OSError, TimeoutError) as exc:
        raise DatabaseUnavailable(
            f"cannot reach the database at {db.display_url}: {exc or type(exc).__name__}",
            hint="check that it is running and that CONTROLPLANE_DATABASE_URL / --db is right",
        ) from exc


#: SQLSTATEs that mean "the server is going away or not there yet", not "your SQL is
#: wrong": connection exceptions (class 08), and operator intervention — admin or crash
#: shutdown, "the database system is starting up / shutting down" (57P01-57P03) — and too
#: many connections (53300). asyncpg reports them as plain DBAPIErrors on a connection
#: SQLAlchemy does not always invalidate; a worker must back off on them, not crash.
_SERVER_GONE = ("08", "57P01", "57P02", "57P03", "53300",
                # ... and the transaction was chosen to be rolled back so others could go
                # on: a deadlock victim or a serialization failure. Retrying is the fix.
                "40P01", "40001")


#: invalid_catalog_name: the URL names a database the server does not have — a
#: configuration to fix, not a bug (exit 3, naming the fix).
_NO_DATABASE = ("3D000",)


def _server_gone(exc: DBAPIError) -> bool:
    return _sqlstate(exc, _SERVER_GONE)


def _sqlstate(exc: DBAPIError, prefixes: tuple[str, ...]) -> bool:
    for err in (exc.orig, getattr(exc.orig, "__cause__", None)):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(code, str) and code.startswith(prefixes):
            return True
    return False


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]
