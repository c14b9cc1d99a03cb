"""A drain on the simulator, in process (the embedded product): 20 pods of varied sizes off
node-1 onto three partly filled nodes, at most 4 at a time; and a drain cancelled
half-way. Invariants are read back from the store and the simulator, never timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.app.operations import send_command
from controlplane.machines.base.commands import Cancel
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from tests.cli.drain_world import clock, drain_world, max_in_flight, max_overlap
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow


async def test_draining_20_pods_never_exceeds_4_in_flight_nor_overfills_a_node(
    tmp_path: Path, db_url: str,
) -> None:
    """Every pod moves with its marker; the node stays cordoned; no target overfilled."""
    async with drain_world(tmp_path, pods=20, db_url=db_url) as w:
        plan = w.plan()
        assert len(plan.moves) == 20
        assert not plan.left
        drain_id = await w.submit(max_parallel=4)
        record = await w.settled(drain_id, limit=110)

        assert record.phase == "Succeeded", record.state
        history = await queries.history(w.db, drain_id)
        assert max_in_flight(history) == 4  # parallel, and never beyond the limit
        children = [str(e.data["child"]) for e in history if e.type == "ChildStarted"]
        assert len(children) == len(set(children)) == 20
        intervals = []
        for child in children:
            row = await queries.get_machine(w.db, child)
            assert (row.kind, row.phase) == ("migration", "Succeeded")
            intervals.append((row.created_at, row.updated_at))
        assert max_overlap(intervals) <= 4  # the children's own rows agree
        assert w.overfilled() == []
        assert w.node_unschedulable("node-1")
        running = w.running_pods()
        for i, name in enumerate(w.names):
            assert running[name]["spec"]["nodeName"] != "node-1"
            assert w.marker_of(name) == f"{name}=v{i}"
        finished = next(e for e in history if e.type == "DrainFinished")
        assert (finished.data["succeeded"], finished.data["failed"]) == (20, 0)


async def test_cancelling_half_way_finishes_running_children_and_uncordons(
    tmp_path: Path, db_url: str,
) -> None:
    """Nothing half-done: every started child ends Succeeded, the rest never start, every
    pod runs exactly once with its marker, the node is schedulable again."""
    async with drain_world(tmp_path, pods=10, max_per_node=2, db_url=db_url) as w:
        drain_id = await w.submit(max_parallel=2)

        async def some_finished() -> bool:
            return len(await w.events(drain_id, "ChildFinished")) >= 3
        await eventually(some_finished, limit_seconds=60, what="3 children finished")
        await send_command(w.db, default_kinds(), machine_id=drain_id,
                           command=Cancel(), now=clock.now())
        w.world.worker.nudge()
        record = await w.settled(drain_id)

        assert record.phase == "Cancelled", record.state
        history = await queries.history(w.db, drain_id)
        started = [str(e.data["child"]) for e in history if e.type == "ChildStarted"]
        assert 3 <= len(started) < 10
        for child in started:
            row = await queries.get_machine(w.db, child)
            assert row.terminal
            assert row.phase == "Succeeded"
        [skipped] = [e for e in history if e.type == "ChildrenSkipped"]
        never = skipped.data["children"]
        assert isinstance(never, list)
        assert len(never) == 10 - len(started)
        assert not set(map(str, never)) & set(started)
        assert [e.type for e in history][-3:] == ["UncordonRequested", "NodeUncordoned",
                                                  "DrainFinished"]
        assert not w.node_unschedulable("node-1")
        assert await queries.list_machines(
            w.db, queries.MachineFilter(settled=False, limit=5)) == []
        running = w.running_pods()
        for i, name in enumerate(w.names):
            assert w.marker_of(name) == f"{name}=v{i}"
        moved = {n for n in w.names if running[n]["spec"]["nodeName"] != "node-1"}
        assert len(moved) == len(started)
        assert w.overfilled() == []
