"""One transaction for many machines' commits and releases (the group writer's unit)."""

from __future__ import annotations

from collections.abc import Sequence

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
        committed = await commit_many_txn(conn, commits) if commits else []
        released = await release_many_txn(conn, releases) if releases else []
    return committed, released
