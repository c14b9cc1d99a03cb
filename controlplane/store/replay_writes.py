"""Replay's writes: put a projection rebuilt from events back in place."""

from __future__ import annotations

from datetime import datetime

from controlplane.store.database import Database
from controlplane.store.event_store import rewrite_projection_txn
from controlplane.store.records import Projection
from controlplane.store.session import write_txn


async def rewrite_projection(
    db: Database, *, machine_id: str, version: int, projection: Projection, now: datetime
) -> None:
    async with write_txn(db) as conn:
        await rewrite_projection_txn(conn, machine_id=machine_id, version=version,
                                     projection=projection, now=now)
