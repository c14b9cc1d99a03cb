"""Replay's read path yields every machine once, in id order, with exactly its events in
seq order — across batch boundaries and with the next batch read ahead."""

from __future__ import annotations

from controlplane.clock import FakeClock
from controlplane.store import queries, replay_reads
from controlplane.store.database import Database
from tests.support.machines import submit_steps


async def test_every_machine_comes_once_in_id_order_with_its_events_in_seq_order(
    db: Database, clock: FakeClock,
) -> None:
    ids = [f"m{i:02d}" for i in range(7)]
    for machine_id in reversed(ids):
        await submit_steps(db, clock, machine_id)
    seen = [(record.id, [(ev.machine_id, ev.seq, ev.type) for ev in events])
            async for record, events in replay_reads.stream_events(db, batch_machines=3)]
    assert [machine_id for machine_id, _ in seen] == ids
    for machine_id, events in seen:
        history = await queries.history(db, machine_id)
        assert events == [(machine_id, ev.seq, ev.type) for ev in history]
        assert [seq for _, seq, _ in events] == list(range(1, len(events) + 1))


async def test_an_empty_store_streams_nothing(db: Database) -> None:
    assert [item async for item in replay_reads.stream_events(db)] == []
