"""Replay's read path yields every machine once, in id order, with its stored projection and
exactly its events (seq, type, data) in seq order — across batch boundaries and with the
next batch read ahead."""

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
    seen = [(projection, events)
            async for projection, events in replay_reads.stream_events(db, batch_machines=3)]
    assert [projection.id for projection, _ in seen] == ids
    for projection, events in seen:
        history = await queries.history(db, projection.id)
        assert [(ev.seq, ev.type, ev.data) for ev in events] == [
            (ev.seq, ev.type, ev.data) for ev in history]
        assert [ev.seq for ev in events] == list(range(1, len(events) + 1))


async def test_the_projection_read_is_the_stored_one(db: Database, clock: FakeClock) -> None:
    await submit_steps(db, clock, "m1")
    stored = await queries.get_machine(db, "m1")
    [(projection, _events)] = [item async for item in replay_reads.stream_events(db)]
    assert (projection.kind, projection.phase, projection.version, projection.terminal,
            projection.state) == (stored.kind, stored.phase, stored.version, stored.terminal,
                                  stored.state)


async def test_an_empty_store_streams_nothing(db: Database) -> None:
    assert [item async for item in replay_reads.stream_events(db)] == []
