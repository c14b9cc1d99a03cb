"""Submitting product operations: bad input refused with nothing written, one live
operation per workload (enforced by the database), limits that queue, and the admitter
letting queued operations in as capacity frees (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.app.operations import submit_operation
from controlplane.clock import FakeClock
from controlplane.engine.observation import Interests, Observation
from controlplane.errors import ControlPlaneError, UsageError
from controlplane.machines.catalog import default_kinds
from controlplane.machines.submission import Limits
from controlplane.store import event_store, queries
from controlplane.store.database import Database
from controlplane.store.records import Projection
from controlplane.worker.admitter import admit_held
from tests.machines.machines_gwt import (
    NS,
    REPO,
    SRC_NODE,
    TARGET,
    TEMPLATE,
    error,
    node,
    pod,
)

KINDS = default_kinds()


class Cluster:
    """An observer over a dict of pods and nodes the test edits."""

    def __init__(self) -> None:
        self.pods: dict[str, Any] = {}
        self.nodes: dict[str, Any] = {SRC_NODE: node(SRC_NODE), TARGET: node(TARGET),
                                      "node-c": node("node-c", cordoned=True)}

    def add_pod(self, name: str, uid: str, node_name: str = SRC_NODE, **kw: Any) -> None:
        self.pods[f"{NS}/{name}"] = pod(name, uid=uid, node=node_name, **kw)

    async def observe(self, interests: Interests) -> Observation:
        return Observation(pods={k: self.pods.get(k) for k in interests.pods},
                           nodes={k: self.nodes.get(k) for k in interests.nodes})


def migration(name: str, uid: str, **patch: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"pod": {"namespace": NS, "name": name, "uid": uid},
                            "source_node": SRC_NODE, "target_node": TARGET,
                            "template": TEMPLATE, "class": {"repository": REPO}}
    body.update(patch)
    return body


async def _submit(db: Database, cluster: Cluster, clock: FakeClock, machine_id: str,
                  spec: dict[str, Any], limits: Limits | None = None) -> Any:
    return await submit_operation(db, KINDS, cluster, kind="migration", spec=spec,
                                  machine_id=machine_id, now=clock.now(), limits=limits)


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    c.add_pod("web", "uid-web")
    return c


async def test_a_valid_migration_is_admitted_and_due(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    outcome = await _submit(db, cluster, clock, "mig-1", migration("web", "uid-web"))
    assert outcome.queued is None
    record = await queries.get_machine(db, "mig-1")
    assert record.next_wake_at == clock.now()
    assert [e.type for e in await queries.history(db, "mig-1")] == ["Submitted"]


@pytest.mark.parametrize(("change", "fragment"), [
    ({"pod": {"namespace": NS, "name": "ghost", "uid": "u"}}, "ghost"),
    ({"pod": {"namespace": NS, "name": "web", "uid": "someone-else"}}, "uid"),
    ({"target_node": SRC_NODE}, "target_node"),
    ({"target_node": "node-zz"}, "node-zz"),
    ({"target_node": "node-c"}, "cordon"),
    ({"class": {"repository": "Not A Repo!"}}, "repository"),
    ({"source_node": "node-b"}, "source_node"),
])
async def test_bad_requests_are_refused_naming_the_field_and_nothing_is_written(
    db: Database, cluster: Cluster, clock: FakeClock, change: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(UsageError, match=fragment):
        await _submit(db, cluster, clock, "bad", migration("web", "uid-web", **change))
    assert await queries.list_machines(db, queries.MachineFilter()) == []


async def test_a_pod_that_is_not_running_is_refused(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.add_pod("pending", "uid-p", phase="Pending")
    with pytest.raises(UsageError, match="Running"):
        await _submit(db, cluster, clock, "bad", migration("pending", "uid-p"))


async def test_an_unanswered_probe_is_a_retry_not_a_rejection(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.pods[f"{NS}/web"] = error("Unavailable")
    with pytest.raises(ControlPlaneError, match="retry") as info:
        await _submit(db, cluster, clock, "m", migration("web", "uid-web"))
    assert not isinstance(info.value, UsageError)
    assert await queries.list_machines(db, queries.MachineFilter()) == []


async def test_a_second_operation_on_a_busy_workload_is_refused(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    await _submit(db, cluster, clock, "first", migration("web", "uid-web"))
    with pytest.raises(UsageError, match="already has a running migration"):
        await _submit(db, cluster, clock, "second", migration("web", "uid-web"))
    assert [r.id for r in await queries.list_machines(db, queries.MachineFilter())] == ["first"]


async def test_racing_submitters_for_one_workload_get_exactly_one_machine(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    """The per-workload rule holds under concurrency (database-enforced)."""
    results = await asyncio.gather(
        *[_submit(db, cluster, clock, f"race-{i}", migration("web", "uid-web"))
          for i in range(6)], return_exceptions=True)
    created = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, UsageError)]
    assert (len(created), len(refused)) == (1, 5)
    assert len(await queries.list_machines(db, queries.MachineFilter())) == 1


async def test_limits_queue_operations_and_the_admitter_lets_them_in_as_slots_free(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    limits = Limits(max_cluster=10, max_per_source_node=2)
    for i in range(4):
        cluster.add_pod(f"w{i}", f"uid-{i}")
    outcomes = [await _submit(db, cluster, clock, f"m{i}", migration(f"w{i}", f"uid-{i}"),
                              limits) for i in range(4)]
    assert [o.queued is None for o in outcomes] == [True, True, False, False]
    assert "node limit" in str(outcomes[2].queued)
    held = await queries.get_machine(db, "m2")
    assert held.next_wake_at is None  # not due: nobody may drive it yet
    assert [e.type for e in await queries.history(db, "m2")] == ["Submitted", "Queued"]

    assert await admit_held(db, limits, now=clock.now()) == []  # still full
    first = await queries.get_machine(db, "m0")
    await event_store.commit(  # m0 finishes
        db, machine_id="m0", expected_version=first.version, events=[_done()],
        projection=Projection("Succeeded", first.state, True), cause="command",
        decision_input={}, now=clock.now(), worker_id="test")
    clock.advance(1)
    assert await admit_held(db, limits, now=clock.now()) == ["m2"]  # FIFO, one slot
    admitted = await queries.get_machine(db, "m2")
    assert admitted.next_wake_at == clock.now()
    assert [e.type for e in await queries.history(db, "m2")] == ["Submitted", "Queued",
                                                                  "Admitted"]
    assert (await queries.get_machine(db, "m3")).next_wake_at is None


def _done() -> Any:
    from controlplane.engine.decider import Event

    return Event("TestFinished")


async def test_a_finished_operation_frees_its_workload(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    await _submit(db, cluster, clock, "first", migration("web", "uid-web"))
    first = await queries.get_machine(db, "first")
    await event_store.commit(
        db, machine_id="first", expected_version=first.version, events=[_done()],
        projection=Projection("Succeeded", first.state, True), cause="command",
        decision_input={}, now=clock.now(), worker_id="test")
    await _submit(db, cluster, clock, "second", migration("web", "uid-web"))
    assert (await queries.get_machine(db, "second")).workload == f"{NS}/web"


async def test_a_submitted_migration_accepts_retarget_and_records_it(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    from controlplane.app.operations import send_command
    from controlplane.machines.base.commands import Retarget

    await _submit(db, cluster, clock, "mig", migration("web", "uid-web"))
    await send_command(db, KINDS, machine_id="mig", command=Retarget(node="node-d"),
                       now=clock.now())
    history = [e.type for e in await queries.history(db, "mig")]
    assert history[-1] == "Retargeted"
    assert (await queries.get_machine(db, "mig")).next_wake_at == clock.now()  # woken


async def test_admission_facts_count_the_same_operations_as_listing_them(
    db: Database, cluster: Cluster, clock: FakeClock
) -> None:
    """Submission counts live operations in SQL (O(1) rows per submission); the counts
    agree with the full list the admitter reads: held ones are not running, finished
    ones are not live, and the same workload is found."""
    from controlplane.store.admission import admission_facts_txn, live_operations_txn
    from controlplane.store.session import read_txn

    for i in range(4):
        cluster.add_pod(f"p{i}", f"uid-{i}", node_name=SRC_NODE if i < 3 else TARGET)
    limits = Limits(max_cluster=2, max_per_source_node=5)
    for i in range(4):
        target = TARGET if i < 3 else SRC_NODE
        await _submit(db, cluster, clock, f"m{i}", migration(
            f"p{i}", f"uid-{i}", source_node=SRC_NODE if i < 3 else TARGET,
            target_node=target), limits=limits)
    async with read_txn(db) as conn:
        live = await live_operations_txn(conn)
        facts = await admission_facts_txn(conn, workload=f"{NS}/p1", source_node=SRC_NODE)
    running = [op for op in live if not op.held]
    assert len(running) == 2
    assert len(live) == 4
    assert facts.running_by_kind == {"migration": 2}
    assert facts.on_node_by_kind == {"migration": sum(op.source_node == SRC_NODE
                                                      for op in running)}
    assert facts.same_workload is not None
    assert facts.same_workload.machine_id == "m1"
