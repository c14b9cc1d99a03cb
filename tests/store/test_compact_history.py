"""History's compact encoding (revision 0007): what is compressed, and that every reader
gets the same history from rows of either layout, so ``replay --verify`` passes on both.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update

from controlplane.app.replay import rebuild, verify
from controlplane.clock import FakeClock
from controlplane.engine.observation import PodView
from controlplane.store import codec, leases, queries, schema
from controlplane.store.database import Database
from controlplane.store.errors import HistoryUnreadable
from controlplane.store.session import read_txn, write_txn
from tests.support.machines import KINDS, submit_steps
from tests.support.workers import RecordingHandler, ScriptedObserver, make_worker

e, m, d = schema.events, schema.machines, schema.decisions


def test_a_value_comes_back_whole_from_the_codec() -> None:
    value = {"pod": "ns/p", "annotations": {"checkpoint.controlplane.dev/pod": "ns/p",
                                            "naïve": "✓"}, "n": [1, 2.5, None, True]}
    blob = codec.encode(value)
    assert blob[0] == codec.FORMAT_ZSTD_V1
    assert codec.decode(blob) == value


def test_a_value_from_a_newer_encoding_is_refused_with_the_fix() -> None:
    with pytest.raises(HistoryUnreadable, match="newer version") as refused:
        codec.decode(b"\x07whatever")
    assert refused.value.exit_code == 3  # cpctl: schema not ready, never "internal error"


def test_small_values_stay_plain_json_and_large_ones_are_compressed_smaller() -> None:
    assert codec.column_pair({}) == ({}, None)
    assert codec.column_pair({"pod_present": False}) == ({"pod_present": False}, None)
    annotations = {f"checkpoint.controlplane.dev/key-{i}": f"value-{i}" for i in range(20)}
    plain, blob = codec.column_pair({"tag_annotations": annotations})
    assert plain is None
    assert blob is not None
    assert len(blob) < len(str(annotations)) / 3
    assert codec.decode(blob) == {"tag_annotations": annotations}


async def _run_gated_machines(db: Database, clock: FakeClock, count: int) -> None:
    """``count`` steps machines gated on a pod each, driven to the end by a worker."""
    observer = ScriptedObserver()
    worker = make_worker(db, clock, RecordingHandler(), observer, max_steps_per_lease=2)
    for i in range(count):
        observer.pods[f"ns/p{i}"] = PodView("ns", f"p{i}", f"u{i}", "node-1", "Running")
        await submit_steps(db, clock, f"m{i}", steps=3, gate_pod=f"ns/p{i}",
                           gate_pod_uid=f"u{i}", deadline_seconds=600)
    for tick in range(20):
        claimed = await leases.claim_due(db, owner="w1", token=f"t{tick}", now=clock.now(),
                                         limit=10, lease_seconds=30)
        if not claimed:
            break
        for c in claimed:
            await worker.drive(c)
        clock.advance(1)


async def _history(db: Database, ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for machine_id in ids:
        record = await queries.get_machine(db, machine_id)
        out[machine_id] = (record.state, await queries.history(db, machine_id),
                           await queries.decisions(db, machine_id))
    return out


async def test_new_rows_hold_facts_inputs_and_state_compressed_and_read_back_whole(
        db: Database, clock: FakeClock) -> None:
    await _run_gated_machines(db, clock, 2)
    async with read_txn(db) as conn:
        events = (await conn.execute(select(e).order_by(e.c.machine_id, e.c.seq))).all()
        machines = (await conn.execute(select(m))).all()
        legacy = await conn.scalar(select(func.count()).select_from(d))
    assert legacy == 0  # no decision row of its own: it rides on its first event
    assert all(r.state is None and r.state_z is not None for r in machines)
    assert [r.seq for r in events if r.cause is not None] == [
        d.first_seq for d in await queries.decisions(db, "m0")] + [
        d.first_seq for d in await queries.decisions(db, "m1")]
    big = [r for r in events if r.facts_z is not None]
    assert big
    assert all(r.facts is None for r in big)
    # Only facts too small to be worth a frame stay plain.
    assert all(len(json.dumps(r.facts, separators=(",", ":"))) < codec.SMALL_JSON
               for r in events if r.facts_z is None)
    for row in big:
        [event] = [x for x in await queries.history(db, row.machine_id) if x.seq == row.seq]
        assert event.facts == codec.decode(row.facts_z)
        assert "pod_uid" in event.facts
    assert (await verify(db, KINDS)).clean
    assert (await rebuild(db, KINDS, now=clock.now())).clean


async def _to_old_layout(db: Database, machine_id: str, *, up_to_seq: int) -> None:
    """Rewrite a machine's rows up to ``up_to_seq`` (and its state) as revision 0006
    wrote them: facts as JSON, decisions in their own table, state as JSON."""
    decisions = [x for x in await queries.decisions(db, machine_id) if x.first_seq <= up_to_seq]
    record = await queries.get_machine(db, machine_id)
    async with write_txn(db) as conn:
        rows = (await conn.execute(select(e).where(e.c.machine_id == machine_id,
                                                   e.c.seq <= up_to_seq))).all()
        for row in rows:
            await conn.execute(update(e).where(e.c.position == row.position).values(
                facts=codec.from_columns(row.facts, row.facts_z), facts_z=None, cause=None,
                input_z=None))
        await conn.execute(insert(d), [
            {"machine_id": machine_id, "first_seq": x.first_seq, "cause": x.cause,
             "input": x.input, "decided_at": x.decided_at} for x in decisions])
        await conn.execute(update(m).where(m.c.id == machine_id).values(
            state=record.state, state_z=None))


async def test_old_rows_and_rows_written_across_the_upgrade_read_and_verify_the_same(
        db: Database, clock: FakeClock) -> None:
    await _run_gated_machines(db, clock, 2)
    before = await _history(db, ["m0", "m1"])
    # m0 entirely as before the upgrade; m1's first events old, its later ones new.
    await _to_old_layout(db, "m0", up_to_seq=10**6)
    await _to_old_layout(db, "m1", up_to_seq=3)
    async with read_txn(db) as conn:
        old = await conn.scalar(select(func.count()).select_from(d))
        new = await conn.scalar(select(func.count()).select_from(e)
                                .where(e.c.machine_id == "m1", e.c.cause.is_not(None)))
    assert old
    assert new
    assert await _history(db, ["m0", "m1"]) == before
    assert (await verify(db, KINDS)).clean
    assert (await rebuild(db, KINDS, now=clock.now())).clean


async def test_verify_still_catches_a_changed_input_in_a_compressed_decision(
        db: Database, clock: FakeClock) -> None:
    """The compressed inputs are what verify re-runs: a tampered one is a mismatch."""
    await _run_gated_machines(db, clock, 1)
    async with write_txn(db) as conn:
        # The decision that opened the gate because it saw the pod running.
        row = (await conn.execute(select(e).where(e.c.machine_id == "m0",
                                                  e.c.type == "GateOpened"))).first()
        assert row is not None
        assert row.cause == "observation"
        seen = codec.decode(row.input_z)
        seen["observation"]["pods"] = {}
        await conn.execute(update(e).where(e.c.position == row.position)
                           .values(input_z=codec.encode(seen)))
    report = await verify(db, KINDS)
    assert [x.machine_id for x in report.mismatches] == ["m0"]


async def test_a_machine_without_events_reads_no_decisions(db: Database,
                                                         clock: FakeClock) -> None:
    await submit_steps(db, clock, "m0", steps=1)
    async with write_txn(db) as conn:
        await conn.execute(delete(e).where(e.c.machine_id == "m0"))
    assert await queries.decisions(db, "m0") == []
