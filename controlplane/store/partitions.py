"""Monthly partitions of the event history on PostgreSQL (issue 26, part 3).

The interface the retention code (``store/retention.py``, the worker's housekeeping)
calls; the partitioning work fills in PostgreSQL's side. SQLite keeps plain tables: both
functions do nothing there.

- :func:`create_ahead`: make sure the monthly partitions from this month to ``months``
  ahead exist (idempotent, safe from several workers at once);
- :func:`drop_summarized_before`: drop each monthly partition whose whole range ends
  before ``before`` and every one of whose rows belongs to an operation that already has
  its summary row (pruned), instead of deleting those rows one by one.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.store.database import Database


async def create_ahead(db: Database, *, now: datetime, months: int = 3) -> list[str]:
    """The partitions created (names); none on SQLite or while history is not partitioned."""
    del db, now, months
    return []


async def drop_summarized_before(db: Database, *, before: datetime) -> list[str]:
    """The partitions dropped (names); none on SQLite or while history is not partitioned."""
    del db, before
    return []
