"""The series the alerts read, as the API and a node agent expose them: a live operation
counts on its node and, once its wake is past, as overdue for its kind (held or terminal
ones do not); a failed operation counts by kind and reason; the history's size is the
events log's; an agent's counters are its own, labelled with its node."""

from __future__ import annotations

from datetime import timedelta

from controlplane.api import metrics
from controlplane.clock import FakeClock, SystemClock
from controlplane.engine.decider import Action
from controlplane.store import event_store, reports
from controlplane.store.database import Database
from controlplane.store.records import Projection
from controlplane.worker.errors import TerminalActionError
from drivers.agent.agent import AgentStats
from drivers.agent.metrics import render as agent_render
from tests.support.api_world import add_running_migration
from tests.support.machines import submit_steps
from tests.support.workers import RecordingHandler, all_terminal, make_worker, run_until


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


async def test_a_live_operation_counts_on_its_node_and_as_overdue_once_its_wake_passed(
        db: Database) -> None:
    await add_running_migration(db, "m-live")
    now = SystemClock().now()
    fresh = samples(await metrics.render(db, now - timedelta(seconds=5)))
    assert fresh['controlplane_node_operations{node="node-1"}'] == 1
    assert fresh['controlplane_operation_wake_overdue_seconds{kind="migration"}'] == 0
    late = samples(await metrics.render(db, now + timedelta(minutes=10)))
    assert 600 <= late['controlplane_operation_wake_overdue_seconds{kind="migration"}'] < 660
    assert late['controlplane_operation_wake_overdue_seconds{kind="checkpoint"}'] == 0


async def test_a_failed_operation_counts_by_kind_and_reason_and_leaves_its_node(
        db: Database, clock: FakeClock) -> None:
    async def refuse(action: Action) -> None:
        raise TerminalActionError("403 Forbidden")

    await submit_steps(db, clock, "m1", steps=2)
    await run_until(make_worker(db, clock, RecordingHandler(hook=refuse)), all_terminal(db))
    values = samples(await metrics.render(db, clock.now() + timedelta(hours=1)))
    failed = {k: v for k, v in values.items()
              if k.startswith("controlplane_operations_failed_total{")}
    assert list(failed.values()) == [1]
    [key] = failed
    assert key.startswith('controlplane_operations_failed_total{kind="steps",reason="')
    assert not key.endswith('reason=""}')
    assert not [k for k in values if k.startswith("controlplane_node_operations")]
    assert values['controlplane_operation_wake_overdue_seconds{kind="steps"}'] == 0
    events = (await reports.rows(db, "SELECT count(*) AS n FROM events"))[0]["n"]
    assert values["controlplane_history_events"] == events > 0


async def test_a_due_operation_is_overdue_by_how_long_ago_its_wake_was(
        db: Database, clock: FakeClock) -> None:
    await submit_steps(db, clock, "m1", steps=1)
    due = samples(await metrics.render(db, clock.now() + timedelta(minutes=3)))
    assert due['controlplane_operation_wake_overdue_seconds{kind="steps"}'] == 180


async def test_an_operation_held_by_admission_counts_on_its_node_but_is_never_overdue(
        db: Database, clock: FakeClock) -> None:
    await event_store.create_machine(
        db, machine_id="m-held", kind="migration",
        spec={"pod": {"namespace": "default", "name": "held", "uid": "uid-held"},
              "target_node": "node-2"},
        initial=Projection("Pending", {}, False), now=clock.now(), worker_id="test",
        workload="default/held", source_node="node-1", admission=lambda _: "max_cluster")
    values = samples(await metrics.render(db, clock.now() + timedelta(hours=1)))
    assert values['controlplane_queue_depth{state="admission"}'] == 1
    assert values['controlplane_node_operations{node="node-1"}'] == 1
    assert values['controlplane_node_operations{node="node-2"}'] == 1
    assert values['controlplane_operation_wake_overdue_seconds{kind="migration"}'] == 0


def test_an_agent_exposes_its_node_and_its_counters() -> None:
    stats = AgentStats(captures=5, pushed=3, failed=1, refused=2, restores=4,
                       restore_failures=1)
    values = samples(agent_render("node-7", stats, started=0.0))
    assert values['controlplane_agent_serving{node="node-7"}'] == 1
    assert values['controlplane_agent_captures_total{node="node-7"}'] == 5
    assert values['controlplane_agent_captures_pushed_total{node="node-7"}'] == 3
    assert values['controlplane_agent_captures_failed_total{node="node-7"}'] == 1
    assert values['controlplane_agent_captures_refused_total{node="node-7"}'] == 2
    assert values['controlplane_agent_restores_total{node="node-7"}'] == 4
    assert values['controlplane_agent_restore_failures_total{node="node-7"}'] == 1
    assert values['controlplane_agent_uptime_seconds{node="node-7"}'] > 0
