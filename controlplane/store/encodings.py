"""Which encodings a database's compressed history may use, checked when it is opened.

A compressed value names its format in its first byte (``store.codec``), but ``0x01``
says "zstd with dictionary v1", not which bytes that dictionary held. The table
``history_encodings`` (revision 0011) records, per database, each format its rows may
use and the SHA-256 of the dictionary behind it. Reading those few rows when the store
opens the database costs nothing per history row, and lets it refuse, with the fix, a
database this code could only fail on row by row: rows from a newer version (a format we
do not have) or compressed with another dictionary under the same byte.

Called by ``store.migrate``: ``upgrade`` checks before and after migrating and records
the format this code writes; ``require_current`` checks and requires that format to be
recorded. Every writer (worker, API, CLI) opens the database through one of the two.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import insert, inspect, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store import codec
from controlplane.store.errors import HistoryUnreadable, SchemaNotReady
from controlplane.store.schema import history_encodings as table


async def recorded_txn(conn: AsyncConnection) -> dict[int, str] | None:
    """The formats the database records (format -> dictionary sha256), or None before
    revision 0011."""
    if not await conn.run_sync(lambda sync: inspect(sync).has_table(table.name)):
        return None
    rows = await conn.execute(select(table.c.format, table.c.dictionary_sha256))
    return {int(r.format): r.dictionary_sha256 for r in rows}


def refuse_unreadable(recorded: Mapping[int, str], *, where: str) -> None:
    """Raise :class:`HistoryUnreadable` if ``recorded`` names a format this code does
    not read, or a dictionary other than the one it has for that format. Pure."""
    for fmt, digest in sorted(recorded.items()):
        ours = codec.READS.get(fmt)
        if ours is None:
            raise HistoryUnreadable(
                f"the database at {where} holds history rows written with history encoding "
                f"{fmt:#04x} (dictionary sha256 {digest}), which this version cannot read "
                f"(it reads {_formats()})",
                hint="upgrade the control plane to the version that wrote them or a later one",
            )
        if digest != ours:
            raise HistoryUnreadable(
                f"the database at {where} holds history rows written with history encoding "
                f"{fmt:#04x} and dictionary sha256 {digest}, but this version's dictionary "
                f"for {fmt:#04x} has sha256 {ours}: those rows would not decode",
                hint="a dictionary never changes once rows use it (a retrained one is a new "
                     "format byte); run a version whose dictionary is the one recorded",
            )


async def check_txn(conn: AsyncConnection, *, where: str) -> dict[int, str] | None:
    """Check this code's dictionaries and the database's recorded encodings; return the
    latter (None before revision 0011)."""
    codec.check_dictionaries()
    recorded = await recorded_txn(conn)
    if recorded is not None:
        refuse_unreadable(recorded, where=where)
    return recorded


async def record_written_txn(conn: AsyncConnection, recorded: Mapping[int, str]) -> None:
    """Record the format this code writes, unless it is recorded already. Run under the
    upgrade's lock (``migrate.upgrade``), so two replicas cannot both insert it."""
    if codec.WRITES not in recorded:
        await conn.execute(insert(table).values(format=codec.WRITES,
                                                dictionary_sha256=codec.READS[codec.WRITES]))


def require_written_recorded(recorded: Mapping[int, str], *, where: str) -> None:
    """Refuse to write rows whose format the database does not record (it would stop
    describing its own rows): ``migrate.upgrade`` records it."""
    if codec.WRITES not in recorded:
        raise SchemaNotReady(
            f"the database at {where} does not record history encoding {codec.WRITES:#04x}, "
            "which this version writes",
            hint="run `cpctl db upgrade` (or start the worker with --upgrade-schema)",
        )


def _formats() -> str:
    return ", ".join(f"{fmt:#04x}" for fmt in sorted(codec.READS))
