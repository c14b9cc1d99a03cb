"""Replay's read path for ``rebuild``: every machine with its events, decisions left out.

``rebuild`` folds events and compares projections; it never looks at the recorded
decisions (``verify`` does, through ``queries.stream_histories``). Leaving them out
saves their query and the decoding of their recorded observations, the largest JSON in
the store. Batches are larger than ``stream_histories``' and the next batch is read
while the caller folds the current one, so the database's time overlaps the fold.

Called by :func:`controlplane.replay.rebuild`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import fields

from sqlalchemy import select

from controlplane.store import schema
from controlplane.store.database import Database
from controlplane.store.leases import row_to_record
from controlplane.store.records import MachineRecord, RecordedEvent
from controlplane.store.session import read_txn

m = schema.machines
e = schema.events
_EVENT_COLUMNS = (e.c.position, e.c.machine_id, e.c.seq, e.c.type, e.c.data, e.c.facts,
                  e.c.recorded_at, e.c.worker_id)
assert [c.name for c in _EVENT_COLUMNS] == [f.name for f in fields(RecordedEvent)]

Batch = list[tuple[MachineRecord, list[RecordedEvent]]]


async def _batch(db: Database, after: str, size: int) -> Batch:
    async with read_txn(db) as conn:
        rows = (await conn.execute(
            select(m).where(m.c.id > after).order_by(m.c.id).limit(size))).all()
        if not rows:
            return []
        records = [row_to_record(r) for r in rows]
        ev_rows = (await conn.execute(
            select(*_EVENT_COLUMNS)
            .where(e.c.machine_id >= records[0].id, e.c.machine_id <= records[-1].id)
            .order_by(e.c.machine_id, e.c.seq))).all()
    by_machine: dict[str, list[RecordedEvent]] = {r.id: [] for r in records}
    for row in ev_rows:
        # By position, in RecordedEvent's field order: a mapping per row cost more than
        # building the event.
        ev = RecordedEvent(*row)
        by_machine[ev.machine_id].append(ev)
    return [(record, by_machine[record.id]) for record in records]


async def stream_events(db: Database, *, batch_machines: int = 2000
                        ) -> AsyncIterator[tuple[MachineRecord, list[RecordedEvent]]]:
    """Every machine with its events in seq order, in id order; one batch read ahead."""
    batch = await _batch(db, "", batch_machines)
    while batch:
        ahead = asyncio.ensure_future(_batch(db, batch[-1][0].id, batch_machines))
        try:
            for item in batch:
                yield item
        except BaseException:
            ahead.cancel()
            raise
        batch = await ahead
