"""The storage contract: runs on SQLite and PostgreSQL (the ``db`` fixture).

Events and projection move together or not at all; a stale writer is refused with a
typed error; leases are exclusive, expire, and fence their former owner.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from controlplane.clock import FakeClock
from controlplane.engine.decider import Event
from controlplane.store import event_store, leases, queries
from controlplane.store.database import Database
from controlplane.store.errors import (
    ConcurrencyConflict,
    LeaseLost,
    MachineExists,
    MachineNotFound,
    WorkloadBusy,
)
from controlplane.store.records import Lease, Projection
from tests.support.machines import submit_steps

PROJ = Projection("Running", {"x": 1}, False)


async def _claim_one(db: Database, clock: FakeClock, owner: str, token: str) -> Lease:
    claimed = await leases.claim_due(db, owner=owner, token=token, now=clock.now(), limit=10,
                                     lease_seconds=30)
    assert len(claimed) == 1
    return claimed[0].lease


async def test_submit_records_a_submitted_event_and_a_due_projection(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1")
    record = await queries.get_machine(db, "m1")
    assert (record.kind, record.phase, record.version, record.terminal) == (
        "steps", "Running", 1, False)
    assert record.next_wake_at == clock.now()
    history = await queries.history(db, "m1")
    assert [(e.seq, e.type) for e in history] == [(1, "Submitted")]
    assert history[0].data["spec"] == record.spec


async def test_submitting_the_same_id_twice_is_refused(db: Database, clock: FakeClock) -> None:
    await submit_steps(db, clock, "m1")
    with pytest.raises(MachineExists):
        await submit_steps(db, clock, "m1")


async def test_commit_appends_contiguous_seqs_and_updates_the_projection_together(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1")
    lease = await _claim_one(db, clock, "w1", "t1")
    events = [Event("A", {"n": 1}, {"pod_uid": "u1"}), Event("B", {"n": 2})]
    version = await event_store.commit(
        db, machine_id="m1", expected_version=1, events=events, projection=PROJ,
        cause="observation", decision_input={"observation": {}}, now=clock.now(),
        worker_id="w1", lease=lease)
    assert version == 3
    record = await queries.get_machine(db, "m1")
    assert (record.version, record.state) == (3, {"x": 1})
    history = await queries.history(db, "m1")
    assert [(e.seq, e.type, e.facts, e.worker_id) for e in history[1:]] == [
        (2, "A", {"pod_uid": "u1"}, "w1"), (3, "B", {}, "w1")]
    assert [d.first_seq for d in await queries.decisions(db, "m1")] == [1, 2]


async def test_a_stale_version_gets_a_conflict_and_writes_nothing(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1")
    await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("A")],
                             projection=PROJ, cause="command", decision_input={},
                             now=clock.now(), worker_id="op")
    with pytest.raises(ConcurrencyConflict):
        await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("B")],
                                 projection=Projection("Other", {}, True), cause="command",
                                 decision_input={}, now=clock.now(), worker_id="op")
    record = await queries.get_machine(db, "m1")
    assert (record.version, record.phase) == (2, "Running")
    assert [e.type for e in await queries.history(db, "m1")] == ["Submitted", "A"]


async def test_an_expired_lease_cannot_commit(db: Database, clock: FakeClock) -> None:
    await submit_steps(db, clock, "m1")
    lease = await _claim_one(db, clock, "w1", "t1")
    clock.advance(31)
    with pytest.raises(LeaseLost):
        await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("A")],
                                 projection=PROJ, cause="observation", decision_input={},
                                 now=clock.now(), worker_id="w1", lease=lease)
    assert (await queries.get_machine(db, "m1")).version == 1


async def test_a_lease_taken_over_fences_the_old_owner(db: Database, clock: FakeClock) -> None:
    """After expiry another worker claims; the first one's late commit is refused."""
    await submit_steps(db, clock, "m1")
    old = await _claim_one(db, clock, "w1", "t1")
    clock.advance(31)
    new = await _claim_one(db, clock, "w2", "t2")
    await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("ByNew")],
                             projection=PROJ, cause="observation", decision_input={},
                             now=clock.now(), worker_id="w2", lease=new)
    with pytest.raises(LeaseLost):
        await event_store.commit(db, machine_id="m1", expected_version=1,
                                 events=[Event("ByOld")], projection=PROJ, cause="observation",
                                 decision_input={}, now=clock.now(), worker_id="w1", lease=old)
    with pytest.raises(LeaseLost):
        await leases.release(db, lease=old, now=clock.now(), wake_at=None, reset_attempts=True)
    assert [e.type for e in await queries.history(db, "m1")] == ["Submitted", "ByNew"]


async def test_a_leased_machine_is_not_claimed_again_until_expiry(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1")
    await _claim_one(db, clock, "w1", "t1")
    assert await leases.claim_due(db, owner="w2", token="t2", now=clock.now(), limit=10,
                                  lease_seconds=30) == []
    clock.advance(29)
    assert await leases.heartbeat(db, owner="w1", token="t1", now=clock.now(),
                                  lease_seconds=30) == 1
    clock.advance(29)  # alive thanks to the heartbeat
    assert await leases.claim_due(db, owner="w2", token="t2", now=clock.now(), limit=10,
                                  lease_seconds=30) == []
    clock.advance(2)
    assert len(await leases.claim_due(db, owner="w2", token="t2", now=clock.now(), limit=10,
                                      lease_seconds=30)) == 1


async def test_concurrent_claims_never_hand_out_the_same_machine(
    db: Database, clock: FakeClock
) -> None:
    for i in range(60):
        await submit_steps(db, clock, f"m{i:02d}")
    batches = await asyncio.gather(*[
        leases.claim_due(db, owner=f"w{i}", token=f"t{i}", now=clock.now(), limit=7,
                         lease_seconds=30) for i in range(10)])
    ids = [c.record.id for batch in batches for c in batch]
    assert len(ids) == len(set(ids)) == 60


async def test_machines_are_not_due_before_their_wake_time(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1")
    lease = await _claim_one(db, clock, "w1", "t1")
    await leases.release(db, lease=lease, now=clock.now(),
                         wake_at=clock.now() + timedelta(seconds=60), reset_attempts=True)
    assert await leases.claim_due(db, owner="w1", token="t2", now=clock.now(), limit=10,
                                  lease_seconds=30) == []
    clock.advance(60)
    assert len(await leases.claim_due(db, owner="w1", token="t3", now=clock.now(), limit=10,
                                      lease_seconds=30)) == 1


async def test_wake_by_key_makes_only_the_interested_machines_due(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "gated", gate_pod="ns/p", gate_pod_uid="uid-1")
    await submit_steps(db, clock, "other", gate_pod="ns/q", gate_pod_uid="uid-2")
    for c in await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                    lease_seconds=30):
        await leases.release(db, lease=c.lease, now=clock.now(), wake_at=None,
                             reset_attempts=True)
    assert await leases.wake_by_key(db, key="uid-1", now=clock.now()) == 1
    due = await leases.claim_due(db, owner="w", token="t2", now=clock.now(), limit=10,
                                 lease_seconds=30)
    assert [c.record.id for c in due] == ["gated"]


async def test_wake_by_keys_wakes_every_interested_machine_in_one_go(
    db: Database, clock: FakeClock
) -> None:
    for mid, uid in (("a", "uid-1"), ("b", "uid-2"), ("c", "uid-3")):
        await submit_steps(db, clock, mid, gate_pod=f"ns/{mid}", gate_pod_uid=uid)
    for c in await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                    lease_seconds=30):
        await leases.release(db, lease=c.lease, now=clock.now(), wake_at=None,
                             reset_attempts=True)
    assert await leases.wake_by_keys(db, keys=["uid-1", "uid-3", "uid-1", "nobody"],
                                     now=clock.now()) == 2
    assert await leases.wake_by_keys(db, keys=[], now=clock.now()) == 0
    due = await leases.claim_due(db, owner="w", token="t2", now=clock.now(), limit=10,
                                 lease_seconds=30)
    assert sorted(c.record.id for c in due) == ["a", "c"]


async def test_a_wake_during_a_lease_is_not_slept_through(
    db: Database, clock: FakeClock
) -> None:
    """A pod event seen while a worker decides makes the machine due right after release."""
    await submit_steps(db, clock, "gated", gate_pod="ns/p", gate_pod_uid="uid-1")
    lease = await _claim_one(db, clock, "w", "t")
    await leases.wake_by_key(db, key="uid-1", now=clock.now())
    await leases.release(db, lease=lease, now=clock.now(), wake_at=None, reset_attempts=True)
    assert (await queries.get_machine(db, "gated")).next_wake_at == clock.now()


async def test_terminal_machines_are_never_due(db: Database, clock: FakeClock) -> None:
    await submit_steps(db, clock, "m1")
    await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("Done")],
                             projection=Projection("Succeeded", {}, True), cause="command",
                             decision_input={}, now=clock.now(), worker_id="op")
    assert (await queries.get_machine(db, "m1")).next_wake_at is None
    await leases.wake_machine(db, machine_id="m1", now=clock.now())
    assert await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                  lease_seconds=30) == []


async def test_unknown_machine_ids_are_reported_as_such(db: Database) -> None:
    with pytest.raises(MachineNotFound, match="no operation with id 'nope'"):
        await queries.get_machine(db, "nope")
    with pytest.raises(MachineNotFound):
        await queries.history(db, "nope")


async def test_a_batch_commit_refuses_only_its_stale_member(
    db: Database, clock: FakeClock
) -> None:
    """Group commit: one transaction for many machines, each with its own guard."""
    from controlplane.store.batch import write_batch
    from controlplane.store.event_store import CommitRequest

    for i in range(4):
        await submit_steps(db, clock, f"m{i}")
    claimed = await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                     lease_seconds=30)
    by_id = {c.record.id: c.lease for c in claimed}
    requests = [
        CommitRequest(machine_id=f"m{i}", expected_version=1 if i != 2 else 7,
                      events=[Event("A", {"i": i})], projection=Projection("P", {"i": i}, i == 3),
                      cause="observation", decision_input={}, now=clock.now(), worker_id="w",
                      lease=by_id[f"m{i}"])
        for i in range(4)
    ]
    committed, released = await write_batch(db, requests, [])
    assert committed[0] == committed[1] == committed[3] == 2
    assert isinstance(committed[2], ConcurrencyConflict)
    assert released == []
    assert [e.type for e in await queries.history(db, "m2")] == ["Submitted"]
    assert (await queries.get_machine(db, "m3")).state == {"i": 3}

    stale = Lease("m1", "w", "not-the-token", by_id["m1"].expires_at, 0)
    releases = [leases.ReleaseRequest(by_id["m0"], clock.now(), None),
                leases.ReleaseRequest(stale, clock.now(), None),
                leases.ReleaseRequest(by_id["m3"], clock.now(), None)]
    _, released = await write_batch(db, [], releases)
    assert released[0] is None
    assert released[2] is None
    assert isinstance(released[1], LeaseLost)
    m0, m1, m3 = [await queries.get_machine(db, i) for i in ("m0", "m1", "m3")]
    assert (m0.lease_owner, m0.next_wake_at) == (None, None)  # sleeps until woken
    assert m1.lease_owner == "w"  # a wrong token releases nothing
    assert (m3.terminal, m3.next_wake_at) == (True, None)


async def test_a_machine_twice_in_one_batch_commits_once_and_refuses_the_second(
    db: Database, clock: FakeClock
) -> None:
    """Two of a worker's tasks decided the same machine and their commits met in one group
    commit: the first moves the version, the second is refused and appends nothing (a
    crash campaign on PostgreSQL recorded both: one statement for the batch reported the
    machine updated for each, and the partitioned events' key allows the same seq at
    another instant)."""
    from controlplane.store.batch import write_batch
    from controlplane.store.event_store import CommitRequest

    for i in range(3):
        await submit_steps(db, clock, f"m{i}")
    claimed = await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                     lease_seconds=30)
    by_id = {c.record.id: c.lease for c in claimed}

    def request(machine: str, event: str) -> CommitRequest:
        return CommitRequest(machine_id=machine, expected_version=1, events=[Event(event, {})],
                             projection=Projection("P", {"by": event}, False),
                             cause="observation", decision_input={}, now=clock.now(),
                             worker_id="w", lease=by_id[machine])

    committed, _ = await write_batch(db, [request("m0", "First"), request("m1", "Other"),
                                          request("m0", "Second"), request("m2", "Third")], [])
    assert committed[0] == committed[1] == committed[3] == 2
    assert isinstance(committed[2], ConcurrencyConflict)
    assert [e.type for e in await queries.history(db, "m0")] == ["Submitted", "First"]
    assert (await queries.get_machine(db, "m0")).state == {"by": "First"}


async def test_a_terminal_machine_with_a_lease_held_is_not_yet_settled(
    db: Database, clock: FakeClock
) -> None:
    """Terminal in the projection is not 'done' until its outbox ran and it is released."""
    await submit_steps(db, clock, "m1")
    lease = await _claim_one(db, clock, "w", "t")
    await event_store.commit(db, machine_id="m1", expected_version=1, events=[Event("Done")],
                             projection=Projection("Succeeded", {}, True), cause="observation",
                             decision_input={}, now=clock.now(), worker_id="w", lease=lease)
    unsettled = queries.MachineFilter(settled=False)
    assert [r.id for r in await queries.list_machines(db, unsettled)] == ["m1"]
    await leases.release(db, lease=lease, now=clock.now(), wake_at=None, reset_attempts=True)
    assert await queries.list_machines(db, unsettled) == []
    assert [r.id for r in await queries.list_machines(db, queries.MachineFilter(settled=True))] \
        == ["m1"]


@pytest.mark.postgres
async def test_a_heartbeat_never_waits_for_a_row_another_transaction_holds(
    pg_database: str, clock: FakeClock,
) -> None:
    """Rows locked right now are skipped (extended by the next heartbeat), so a heartbeat
    cannot deadlock with its own worker's group commit."""
    import asyncpg

    from controlplane.store import migrate
    from controlplane.store.database import open_database

    admin = await asyncpg.connect(pg_database, timeout=10)
    try:  # an empty schema of its own, as the db_url fixture gives
        await admin.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    finally:
        await admin.close()
    db = open_database(pg_database)
    try:
        await migrate.upgrade(db)
        for mid in ("a", "b"):
            await submit_steps(db, clock, mid)
        claimed = await leases.claim_due(db, owner="w1", token="t1", now=clock.now(),
                                         limit=10, lease_seconds=30)
        assert len(claimed) == 2
        holder = await asyncpg.connect(pg_database, timeout=10)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM machines WHERE id = 'a' FOR UPDATE")
            clock.advance(10)
            async with asyncio.timeout(10):  # it would block until the holder commits
                extended = await leases.heartbeat(db, owner="w1", token="t1",
                                                  now=clock.now(), lease_seconds=30)
            await tx.rollback()
        finally:
            await holder.close()
        assert extended == 1  # b now; a at the next heartbeat
        clock.advance(1)
        assert await leases.heartbeat(db, owner="w1", token="t1", now=clock.now(),
                                      lease_seconds=30) == 2
    finally:
        await db.dispose()


async def test_a_group_commit_replaces_each_machines_wake_keys_and_keeps_unchanged_ones(
    db: Database, clock: FakeClock
) -> None:
    """One batch: "a" moves from uid-a to uid-a2, "b" drops its keys, "c" keeps its own
    (``wake_keys=None``); a wake then reaches exactly the machines now interested."""
    for mid in ("a", "b", "c"):
        await submit_steps(db, clock, mid, gate_pod=f"ns/{mid}", gate_pod_uid=f"uid-{mid}")
    claimed = await leases.claim_due(db, owner="w", token="t", now=clock.now(), limit=10,
                                     lease_seconds=30)
    by_id = {c.record.id: c.lease for c in claimed}
    new_keys = {"a": frozenset({"uid-a2", "uid-shared"}), "b": frozenset(), "c": None}
    outcomes = await event_store.commit_many(db, [
        event_store.CommitRequest(
            machine_id=mid, expected_version=1, events=[Event("Moved", {})],
            projection=Projection("Running", {}, False, new_keys[mid]), cause="observation",
            decision_input={}, now=clock.now(), worker_id="w", lease=by_id[mid])
        for mid in ("a", "b", "c")])
    assert outcomes == [2, 2, 2]
    for c in claimed:
        await leases.release(db, lease=c.lease, now=clock.now(), wake_at=None,
                             reset_attempts=True)
    assert await leases.wake_by_keys(db, keys=["uid-a", "uid-b"], now=clock.now()) == 0
    assert await leases.wake_by_keys(db, keys=["uid-a2", "uid-c"], now=clock.now()) == 2
    due = await leases.claim_due(db, owner="w", token="t2", now=clock.now(), limit=10,
                                 lease_seconds=30)
    assert sorted(c.record.id for c in due) == ["a", "c"]


async def test_a_taken_id_is_machine_exists_and_a_taken_workload_is_workload_busy(
    db: Database, clock: FakeClock
) -> None:
    """Both are found by the insert itself (no lookup before it); the failed creation
    writes nothing, and the first machine keeps its history and its wake key."""
    async def create(machine_id: str, workload: str) -> None:
        await event_store.create_machine(
            db, machine_id=machine_id, kind="steps", spec={"steps": 1},
            initial=Projection("Running", {}, False, frozenset({f"uid-{machine_id}"})),
            now=clock.now(), worker_id="op", workload=workload)

    await create("m1", "ns/p")
    with pytest.raises(MachineExists, match="m1"):
        await create("m1", "ns/q")
    with pytest.raises(WorkloadBusy, match="ns/p"):
        await create("m2", "ns/p")
    with pytest.raises(MachineNotFound):
        await queries.get_machine(db, "m2")
    assert [e.seq for e in await queries.history(db, "m1")] == [1]
    assert await leases.wake_by_keys(db, keys=["uid-m1", "uid-m2"], now=clock.now()) == 1
