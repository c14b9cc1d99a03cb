"""Retention on SQLite and PostgreSQL: a prune replaces settled
operations' history by summary rows, and every report over all time adds up the same
before, in the middle of, and after a prune; unsettled operations are never pruned.

The history is the real product's (the demo's checkpoint, migration, suspend and resume
through the simulator, agents and on-disk registry) plus a drain of three children made
by the real drain decider (``tests/support/recorded_drain.py``), as
``tests/cli/test_drain_reports.py`` makes it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from controlplane.cli.demo import Demo
from controlplane.clock import FakeClock, SystemClock
from controlplane.store import reports, retention, schema
from controlplane.store.database import Database
from controlplane.store.session import read_txn, write_txn
from controlplane.wiring.embedded import embedded
from tests.support.recorded_drain import DRAIN, make_drain

ALL_DAYS = retention.Policy(default_days=0)


@pytest.fixture
async def history(db: Database, tmp_path: Path) -> Database:
    async with embedded(db, tmp_path, SystemClock()) as world:
        await Demo(db, world, time.monotonic()).run()
    await make_drain(db, FakeClock(datetime.now(UTC) - timedelta(hours=1)))
    return db


def _key(row: dict[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in row.items()))


async def everything(db: Database) -> dict[str, Any]:
    """Every view's rows, every ``cpctl report`` and every summary-page query."""
    out: dict[str, Any] = {}
    for view in reports.VIEWS:
        out[view] = sorted(_key(r) for r in await reports.rows(db, f"SELECT * FROM {view}"))
    for name in reports.REPORTS:
        for by in reports.GROUPINGS:
            out[f"report {name} --by {by}"] = await reports.report(db, report=name, by=by)
    out["report drains"] = await reports.report(db, report="drains", by="kind")
    out["durations"] = sorted(await reports.finished_durations(db))
    out["phases"] = sorted(_key(r) for r in await reports.migration_phases(db))
    out["checkpoints"] = await reports.checkpoint_summaries(db)
    out["hourly"] = sorted(_key(r) for r in await reports.operations_since(
        db, datetime(2000, 1, 1, tzinfo=UTC)))
    out["failures"] = sorted(_key(r) for r in await reports.failures_by_reason(db))
    out["bytes"] = sorted(_key(r) for r in await reports.bytes_by_class(db))
    out["drain"] = await reports.drain_row(db, None)
    out["drain targets"] = sorted(_key(r) for r in await reports.drain_targets(db, DRAIN))
    out["requesters"] = await reports.requesters(db)
    return out


async def counts(db: Database) -> dict[str, int]:
    async with read_txn(db) as conn:
        return {t.name: int((await conn.execute(select(func.count()).select_from(t)))
                            .scalar_one())
                for t in (schema.machines, schema.events, schema.decisions,
                          schema.machine_keys, schema.operation_summaries)}


async def test_every_report_over_all_time_is_the_same_after_a_prune(history: Database) -> None:
    """Views, ``cpctl report`` (every grouping), drains and the summary page's queries."""
    before = await everything(history)
    assert before["report drains"]
    assert before["phases"]
    assert before["checkpoints"]
    report = await retention.prune(history, policy=ALL_DAYS, now=datetime.now(UTC),
                                   batch=2)
    assert report.summarized == 5
    assert report.machines_deleted == 5
    assert await everything(history) == before
    left = await counts(history)
    assert (left["machines"], left["events"], left["decisions"], left["machine_keys"]) == (
        0, 0, 0, 0)
    assert left["operation_summaries"] == 5


async def test_a_summarized_operation_whose_rows_remain_is_counted_once(
    history: Database,
) -> None:
    """The in-between state of a crashed prune (summaries committed, history not yet
    deleted) reports the same, and the next prune finishes it off."""
    before = await everything(history)
    now = datetime.now(UTC)
    report = await retention.prune(history, policy=ALL_DAYS, now=now, batch=2,
                                   dry_run=True)
    assert report.summarized == 5
    assert (await counts(history))["operation_summaries"] == 0
    summarized = await retention.summarize(history, policy=ALL_DAYS, now=now, batch=2)
    assert summarized.summarized == 5
    assert (await counts(history))["machines"] == 5
    assert await everything(history) == before
    again = await retention.prune(history, policy=ALL_DAYS, now=now, batch=2)
    assert again.summarized == 0
    assert again.machines_deleted == 5
    assert await everything(history) == before


async def test_unsettled_operations_are_never_pruned(history: Database) -> None:
    """Not terminal, a lease held, a wake set or actions pending: each kept whole."""
    async with read_txn(history) as conn:
        found = await conn.execute(select(schema.machines.c.id))
        ids = sorted(str(r[0]) for r in found)
    m = schema.machines
    later = datetime.now(UTC) + timedelta(days=1)
    async with write_txn(history) as conn:
        await conn.execute(update(m).where(m.c.id == ids[0]).values(terminal=False))
        await conn.execute(update(m).where(m.c.id == ids[1]).values(lease_owner="w1"))
        await conn.execute(update(m).where(m.c.id == ids[2]).values(next_wake_at=later))
        await conn.execute(update(m).where(m.c.id == ids[3]).values(
            pending_actions=[{"type": "DeletePod"}]))
    report = await retention.prune(history, policy=ALL_DAYS, now=datetime.now(UTC))
    assert report.summarized == 1
    async with read_txn(history) as conn:
        found = await conn.execute(select(m.c.id))
        left = sorted(str(r[0]) for r in found)
    assert left == ids[:4]
    for machine_id in ids[:4]:
        assert await retention.summary(history, machine_id) is None


async def test_keep_days_per_kind_and_per_class(history: Database) -> None:
    now = datetime.now(UTC)
    assert (await retention.prune(history, policy=retention.Policy(default_days=30),
                                  now=now)).summarized == 0
    only_drains = retention.Policy(default_days=30, by_kind={"drain": 0})
    assert (await retention.prune(history, policy=only_drains, now=now)).summarized == 1
    assert (await retention.summary(history, DRAIN)) is not None
    m = schema.machines
    async with read_txn(history) as conn:
        target, spec = (await conn.execute(select(m.c.id, m.c.spec)
                                           .where(m.c.kind == "checkpoint"))).one()
    spec = {**spec, "class": {**spec.get("class", {}), "history_keep_days": 0}}
    async with write_txn(history) as conn:
        await conn.execute(update(m).where(m.c.id == target).values(spec=spec))
    # The class's days win over --keep-days 30 (and apply with no --keep-days at all).
    report = await retention.prune(history, policy=retention.Policy(), now=now)
    assert report.summarized == 1
    row = await retention.summary(history, target)
    assert row is not None
    assert row["kind"] == "checkpoint"
    assert row["outcome"] == "Succeeded"


async def test_a_summary_keeps_kind_nodes_outcome_milestones_and_bytes(
    history: Database,
) -> None:
    async with read_txn(history) as conn:
        [migration] = [str(r[0]) for r in await conn.execute(
            select(schema.machines.c.id).where(schema.machines.c.kind == "migration"))]
    await retention.prune(history, policy=ALL_DAYS, now=datetime.now(UTC))
    row = await retention.summary(history, migration)
    assert row is not None
    assert (row["workload"], row["source_node"], row["target_node"], row["final_node"]) == (
        "default/app", "node-1", "node-2", "node-2")
    assert (row["outcome"], row["reason"], row["class_name"]) == (
        "Succeeded", "Migrated", "default")
    assert row["bytes"] > 0
    assert row["events"] >= 5
    assert row["requester"]
    assert row["milestones"]["migration"]["restore_verified_at"]
    assert len(row["milestones"]["checkpoints"]) == 1
    drain = await retention.summary(history, DRAIN)
    assert drain is not None
    assert len(drain["milestones"]["drain_children"]) == 3


async def test_an_operation_woken_after_its_summary_keeps_its_history(
    history: Database,
) -> None:
    """A summary is only a promise: if the machine moved before its rows were deleted
    (its version changed), the summary goes and the history stays."""
    now = datetime.now(UTC)
    await retention.summarize(history, policy=ALL_DAYS, now=now)
    m = schema.machines
    async with write_txn(history) as conn:
        await conn.execute(update(m).where(m.c.id == DRAIN).values(version=m.c.version + 1))
    report = await retention.prune(history, policy=ALL_DAYS, now=now)
    assert report.revived == 1
    assert report.machines_deleted == 4
    assert await retention.summary(history, DRAIN) is None
    async with read_txn(history) as conn:
        assert (await conn.execute(select(m.c.id))).scalars().all() == [DRAIN]


async def test_the_archive_holds_each_operation_and_a_rerun_writes_the_same_file(
    history: Database, tmp_path: Path,
) -> None:
    async with read_txn(history) as conn:
        found = await conn.execute(select(schema.machines.c.id))
        ids = sorted(str(r[0]) for r in found)
    first = await retention.write_archive(history, tmp_path / "a", ids)
    again = await retention.write_archive(history, tmp_path / "a", list(reversed(ids)))
    assert first == again
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name]
    items = retention.read_archive(first)
    assert [i.record.id for i in items] == ids
    drain = next(i for i in items if i.record.id == DRAIN)
    assert [e.seq for e in drain.events] == list(range(1, len(drain.events) + 1))
    assert drain.record.created_at.tzinfo is not None

    report = await retention.prune(history, policy=ALL_DAYS, now=datetime.now(UTC),
                                   archive=tmp_path / "b", batch=10)
    assert len(report.archives) == 1
    assert {i.record.id for i in retention.read_archive(Path(report.archives[0]))} == set(ids)


async def test_import_puts_an_archived_operation_back_once(
    history: Database, tmp_path: Path,
) -> None:
    from controlplane.store import queries

    before = {r.id: (r, await queries.history(history, r.id))
              for r in await queries.list_machines(history, queries.MachineFilter(limit=100))}
    reports_before = await everything(history)
    report = await retention.prune(history, policy=ALL_DAYS, now=datetime.now(UTC),
                                   archive=tmp_path)
    for path in report.archives:
        for item in retention.read_archive(Path(path)):
            assert await retention.import_archived(history, item)
            assert not await retention.import_archived(history, item)
    assert (await counts(history))["operation_summaries"] == 0
    for machine_id, (_record, events) in before.items():  # positions are new: appended
        back = await queries.history(history, machine_id)
        assert [replace(e, position=0) for e in back] == [replace(e, position=0)
                                                         for e in events]
    assert await everything(history) == reports_before
