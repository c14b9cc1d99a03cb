"""A rebuild split over processes (``jobs``) reports and repairs exactly what one process
does: every machine once, the same mismatches in id order, the same rewrites."""

from __future__ import annotations

from controlplane.app.replay import RebuildProgress, rebuild, verify
from controlplane.clock import FakeClock
from controlplane.engine.kinds import KindRegistry
from controlplane.store import queries, replay_reads
from controlplane.store.database import Database
from controlplane.store.records import Projection
from controlplane.store.replay_writes import rewrite_projection
from tests.support.machines import KINDS, DriftedSteps, submit_steps
from tests.support.workers import drive_due_once

IDS = [f"m{i:02d}" for i in range(9)]


async def _history(db: Database, clock: FakeClock) -> None:
    for machine_id in IDS:
        await submit_steps(db, clock, machine_id, steps=2)
    await drive_due_once(db, clock, limit=20)


async def _corrupt(db: Database, clock: FakeClock, machine_id: str) -> None:
    good = await queries.get_machine(db, machine_id)
    await rewrite_projection(db, machine_id=machine_id, version=good.version, now=clock.now(),
                             projection=Projection("Running", dict(good.state, done=0), False))


async def test_the_id_ranges_cover_every_machine_once_in_order(
        db: Database, clock: FakeClock) -> None:
    await _history(db, clock)
    ranges = await replay_reads.split_ids(db, 3)
    assert len(ranges) == 3
    seen = [projection.id for after, until in ranges
            async for projection, _events in replay_reads.stream_events(
                db, after=after, until=until)]
    assert seen == IDS


async def test_a_parallel_rebuild_finds_and_repairs_what_one_process_does(
        db: Database, clock: FakeClock) -> None:
    await _history(db, clock)
    for machine_id in ("m01", "m07"):  # one in the first range, one in the last
        await _corrupt(db, clock, machine_id)
    alone = await rebuild(db, KINDS, now=clock.now())
    split = await rebuild(db, KINDS, now=clock.now(), jobs=2)
    assert (split.machines, split.events) == (alone.machines, alone.events)
    assert split.machines == 9
    assert split.events > 9
    assert split.mismatches == alone.mismatches
    assert {m.machine_id for m in split.mismatches} == {"m01", "m07"}
    fixed = await rebuild(db, KINDS, now=clock.now(), write=True, jobs=2)
    assert fixed.rewritten == 2
    assert (await rebuild(db, KINDS, now=clock.now(), jobs=2)).clean


async def test_progress_adds_up_to_the_report_in_one_process_and_in_several(
        db: Database, clock: FakeClock) -> None:
    await _history(db, clock)
    for jobs in (1, 2):
        seen: list[RebuildProgress] = []
        report = await rebuild(db, KINDS, now=clock.now(), jobs=jobs, progress=seen.append)
        assert seen
        assert seen[-1] == RebuildProgress(report.machines, report.events, len(IDS))
        assert [p.machines for p in seen] == sorted(p.machines for p in seen)


async def test_a_parallel_verify_finds_what_one_process_does(
        db: Database, clock: FakeClock) -> None:
    await _history(db, clock)
    assert (await verify(db, KINDS, jobs=2)).clean
    drifted = KindRegistry([DriftedSteps()])
    alone = await verify(db, drifted)
    seen: list[RebuildProgress] = []
    split = await verify(db, drifted, jobs=2, progress=seen.append)
    assert (split.machines, split.events, split.decisions) == (
        alone.machines, alone.events, alone.decisions)
    assert split.decisions > split.machines
    assert split.mismatches == alone.mismatches
    assert {m.machine_id for m in split.mismatches} == set(IDS)
    assert seen[-1] == RebuildProgress(len(IDS), split.events, len(IDS))
