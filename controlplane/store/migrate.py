"""Apply and check the schema through Alembic, guarded against concurrent upgrades.

``upgrade`` runs every pending migration on the connection of our own ``Database``;
on PostgreSQL it first takes a transaction-scoped advisory lock, so several replicas
starting at once upgrade one at a time (SQLite's ``BEGIN IMMEDIATE`` does the same).
``require_current`` is what workers call at start when not told to upgrade. Both also
refuse a database whose history this code cannot read (``store.encodings``), first, so
that a database from a newer version gets "upgrade the control plane", not "upgrade the
schema".
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

import migrations
from controlplane.store import encodings
from controlplane.store.database import Database
from controlplane.store.errors import SchemaNotReady
from controlplane.store.session import read_txn, write_txn

_ADVISORY_LOCK_KEY = 0x6370637472  # "cpctr": one cluster-wide key for schema upgrades


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def current_revision(db: Database) -> str | None:
    async with read_txn(db) as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


async def upgrade(db: Database, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade to ``revision``; return (revision before, revision after)."""
    before = await current_revision(db)
    async with write_txn(db) as conn:
        if db.backend == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
        await encodings.check_txn(conn, where=db.display_url)
        await conn.run_sync(_run_upgrade, revision)
        recorded = await encodings.check_txn(conn, where=db.display_url)
        if recorded is not None:
            await encodings.record_written_txn(conn, recorded)
    return before, await current_revision(db) or ""


def _run_upgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


async def downgrade(db: Database, revision: str) -> None:
    async with write_txn(db) as conn:
        if db.backend == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
        await conn.run_sync(_run_downgrade, revision)


def _run_downgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.downgrade(cfg, revision)


async def require_current(db: Database) -> None:
    """Raise :class:`SchemaNotReady` unless the schema is at this code's head and its
    history is in encodings this code reads (:class:`HistoryUnreadable`) and records the
    one it writes."""
    async with read_txn(db) as conn:
        recorded = await encodings.check_txn(conn, where=db.display_url)
    current = await current_revision(db)
    head = head_revision()
    if current != head:
        raise SchemaNotReady(
            f"the database at {db.display_url} is at schema {current or 'none'}, "
            f"this code needs {head}",
            hint="run `cpctl db upgrade` (or start the worker with --upgrade-schema)",
        )
    encodings.require_written_recorded(recorded or {}, where=db.display_url)
