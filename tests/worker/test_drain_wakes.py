"""A drain is woken by its children ending, not by polling the store: with the clock
frozen (no wake time ever comes), a drain still moves from child to child and ends, and
it reads its children only as often as they end. The children run on another worker
(``kinds``), so the wake reaches a parent that worker never held (both backends)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from controlplane.app.operations import submit
from controlplane.clock import FakeClock
from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import Interests, NodeView, Observation
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.machine import DrainDecider
from controlplane.machines.selftest.steps import WORK_ACTION, StepsDecider
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineExists
from controlplane.worker.actions import ActionRunner
from controlplane.worker.child_machines import StoreMachineObserver
from controlplane.worker.loop import Worker, WorkerConfig
from tests.machines.machines_gwt import REPO, TEMPLATE
from tests.support.workers import FAST_RETRIES, all_terminal, run_until

KINDS = KindRegistry([StepsDecider(), DrainDecider()])
NODE = "node-a"


@dataclass
class CordonedNodeAndStore:
    """The node is cordoned already; children are read from the store, and counted."""

    store: StoreMachineObserver
    child_reads: int = 0

    async def observe(self, interests: Interests) -> Observation:
        machines = Observation()
        if interests.machines:
            self.child_reads += 1
            machines = await self.store.observe(interests)
        return Observation(nodes={n: NodeView(n, ready=True, unschedulable=True)
                                  for n in interests.nodes}, machines=machines.machines)


def drain_spec(pods: int) -> JsonObject:
    return DrainDecider().validate_spec({
        "node": NODE, "max_parallel": 1, "class": {"repository": REPO}, "left": [],
        "children": [{"pod": {"namespace": "apps", "name": f"p{i}", "uid": f"uid-{i}"},
                      "target": "node-b", "template": TEMPLATE} for i in range(pods)]})


async def test_a_child_ending_wakes_its_drain_with_the_clock_frozen(
    db: Database, clock: FakeClock,
) -> None:
    async def submit_child(action: Action) -> None:  # each child: a 2-step machine
        with contextlib.suppress(MachineExists):
            await submit(db, KINDS, kind="steps", spec={"steps": 2},
                         machine_id=str(action.params["machine_id"]), now=clock.now())

    async def nothing(_action: Action) -> None:
        return None

    observer = CordonedNodeAndStore(StoreMachineObserver(db))
    runner = ActionRunner({ActionType.SUBMIT_OPERATION: submit_child, WORK_ACTION: nothing},
                          FAST_RETRIES)
    drains = Worker(db, KINDS, observer, runner, clock,
                    WorkerConfig(worker_id="drains", poll_seconds=0.01, kinds=("drain",)))
    children = Worker(db, KINDS, observer, runner, clock,
                      WorkerConfig(worker_id="children", poll_seconds=0.01, kinds=("steps",)))
    await submit(db, KINDS, kind="drain", spec=drain_spec(pods=3), machine_id="drain-1",
                 now=clock.now())

    task = asyncio.create_task(children.run())
    try:
        await run_until(drains, all_terminal(db), limit_seconds=20)
    finally:
        children.stop()
        await task

    record = await queries.get_machine(db, "drain-1")
    assert record.phase == "Succeeded", record.state
    history = [e.type for e in await queries.history(db, "drain-1")]
    assert history.count("ChildFinished") == 3
    # One read right after each child starts, one when its end wakes the drain: a poll
    # would read them again and again while a child runs (here it could not: time stands).
    assert observer.child_reads <= 2 * 3
