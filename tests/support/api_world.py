"""The HTTP API's world in tests: real histories in the ``db`` fixture's database and the
API served over them.

:func:`run_demo` writes ``cpctl demo``'s history (checkpoint, migration, suspend,
resume on the embedded simulator); :func:`run_drain` adds a drain of three pods off
``node-1`` (one deleted after planning, so its child is refused);
:func:`add_running_migration` and :func:`advance` write a live migration by hand.
:func:`serving` runs the API over a database on loopback as ``cpctl serve`` does, and
:func:`auth` is the header its :data:`TOKEN` opens. Used by ``tests/api/conftest.py``'s
fixtures and by the API and dashboard tests in ``tests/api``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from controlplane.api.app import make_app
from controlplane.api.serving import make_runner
from controlplane.app.operations import submit_operation
from controlplane.cli.demo import Demo
from controlplane.clock import SystemClock, new_id
from controlplane.engine.decider import Event
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.planning import node_info, plan_drain, pod_info
from controlplane.machines.drain.request import drain_spec
from controlplane.machines.submission import Limits
from controlplane.store import event_store, queries
from controlplane.store.database import Database
from controlplane.store.records import Projection
from controlplane.wiring.embedded import embedded
from tests.support.waiting import eventually

TOKEN = "test-token-5f1c9a"
NS = "default"
PODS = ("web-a", "web-b", "gone")  # "gone" is deleted between plan and drain: refused
clock = SystemClock()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def serving(db: Database) -> AsyncIterator[str]:
    """The API over ``db`` on a free loopback port, as ``cpctl serve`` runs it; its URL."""
    runner = make_runner(make_app(db, token=TOKEN))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class History:
    db: Database
    migration_id: str
    checkpoint_id: str


async def run_demo(db: Database, root: Path) -> History:
    async with embedded(db, root, SystemClock()) as world:
        await Demo(db, world, time.monotonic()).run()
    machines = await queries.list_machines(db, queries.MachineFilter())
    by_kind = {m.kind: m.id for m in machines}
    return History(db, by_kind["migration"], by_kind["checkpoint"])


@dataclass(frozen=True)
class DrainHistory:
    db: Database
    drain_id: str
    migration_id: str  # the demo's own migration: no drain's child


async def run_drain(db: Database, root: Path) -> str:
    """Drain node-1 (three pods, one at a time, so the rows appear in a fixed order)
    until the drain is settled."""
    async with embedded(db, root, clock, nodes=["node-1", "node-2", "node-3"],
                        limits=Limits(max_cluster=10, max_per_source_node=4)) as world:
        cluster = world.cluster
        for name in PODS:
            cluster.create_pod(NS, name, node="node-1", cpu="100m", memory="64Mi",
                               labels={"app": name})
        await cluster.wait_for(lambda: sum(
            (p.get("status") or {}).get("phase") == "Running"
            for p in cluster.store.peek("pods")) == len(PODS), what="pods running",
            limit_seconds=30)
        pods = list(cluster.store.peek("pods"))
        plan = plan_drain("node-1", [node_info(n) for n in cluster.store.peek("nodes")],
                          [pod_info(p) for p in pods])
        klass = {"repository": world.repository("checkpoints/drain"),
                 "timeouts": {"capture": 60, "restore": 60, "schedule": 30, "gc": 60}}
        spec = drain_spec(plan, pods, klass, max_parallel=1)
        cluster.store.delete("pods", NS, "gone", grace=0)
        outcome = await submit_operation(db, default_kinds(), world.submission_observer,
                                         kind="drain", spec=spec, machine_id=new_id(),
                                         now=clock.now())
        world.worker.nudge()

        async def settled() -> bool:
            r = await queries.get_machine(db, outcome.machine_id)
            return r.terminal and r.lease_owner is None and r.next_wake_at is None
        await eventually(settled, limit_seconds=90, every=0.05, what="drain settled")
    return outcome.machine_id


async def add_running_migration(db: Database, machine_id: str) -> None:
    """A live migration submitted now (a worker never runs it: the test moves it)."""
    await event_store.create_machine(
        db, machine_id=machine_id, kind="migration",
        spec={"pod": {"namespace": "default", "name": "live", "uid": "uid-live"}},
        initial=Projection("Pending", {}, False), now=SystemClock().now(), worker_id="test",
        workload="default/live", source_node="node-1")


async def advance(db: Database, machine_id: str, phase: str, event: Event) -> None:
    record = await queries.get_machine(db, machine_id)
    await event_store.commit(
        db, machine_id=machine_id, expected_version=record.version, events=[event],
        projection=Projection(phase, record.state, False), cause="command",
        decision_input={}, now=SystemClock().now(), worker_id="test")
