"""One transaction for many machines' commits and releases (the group writer's unit)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store import schema
from controlplane.store.database import Database
from controlplane.store.errors import LeaseLost, StaleWriter
from controlplane.store.event_store import CommitRequest, commit_many_txn
from controlplane.store.leases import ReleaseRequest, release_many_txn
from controlplane.store.session import write_txn


async def write_batch(
    db: Database, commits: Sequence[CommitRequest], releases: Sequence[ReleaseRequest]
) -> tuple[list[int | StaleWriter], list[LeaseLost | None]]:
    """Commit, then release, in one transaction; per-machine refusals are returned."""
    async with write_txn(db) as conn:
        await lock_in_id_order_txn(conn, [c.machine_id for c in commits]
                                   + [r.lease.machine_id for r in releases])
        committed = await commit_many_txn(conn, commits) if commits else []
        released = await release_many_txn(conn, releases) if releases else []
    return committed, released


async def lock_in_id_order_txn(conn: AsyncConnection, ids: Sequence[str]) -> None:
    """Take the group's row locks in id order before writing (PostgreSQL).

    A group transaction updates many machines; so does a burst of pod wakes. Two such
    transactions taking their row locks in different orders deadlock (seen by the scale
    benchmark). Everything that locks several machines locks them in id order. SQLite
    has one writer: nothing to order.
    """
    if conn.dialect.name == "postgresql" and len(ids) > 1:
        m = schema.machines
        await conn.execute(select(m.c.id).where(m.c.id.in_(sorted(set(ids))))
                           .order_by(m.c.id).with_for_update())
