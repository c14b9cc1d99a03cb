"""The drain reporting views (migration 0005) and a drain's one row in
``report_operations`` (0006) give the same figures on SQLite and
PostgreSQL: children per drain, outcomes, failures by reason, durations.

The history is made by the real decider (pure) and committed through the event store, as
a worker would: two children finish (one succeeded, one rolled back), one is refused.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controlplane.app.operations import submit
from controlplane.clock import FakeClock
from controlplane.engine.decider import Event, fold
from controlplane.engine.observation import MachineView, NodeView, Observation
from controlplane.machines.catalog import default_kinds
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.machine import DrainDecider, child_id
from controlplane.machines.drain.state import submit_key
from controlplane.store import event_store, reports
from controlplane.store.database import Database
from controlplane.store.records import Projection

TEMPLATE = {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
DRAIN = "drain-r"


def node(cordoned: bool, children: dict[str, MachineView] | None = None) -> Observation:
    return Observation(nodes={"n1": NodeView("n1", True, cordoned)},
                       machines=dict(children or {}))


async def test_drain_views_count_children_outcomes_and_failure_reasons(
    db: Database, clock: FakeClock,
) -> None:
    spec: dict[str, Any] = {"node": "n1", "max_parallel": 3, "class": {
        "repository": "localhost:5000/r"}, "children": [
            {"pod": {"namespace": "d", "name": f"p{i}", "uid": f"u{i}"}, "target": "n2",
             "template": TEMPLATE} for i in range(3)]}
    await submit(db, default_kinds(), kind="drain", spec=spec, machine_id=DRAIN,
                 now=clock.now())
    decider = DrainDecider()
    state = decider.initial_state(DRAIN, decider.validate_spec(spec))
    version = 1
    ids = [child_id(DRAIN, f"u{i}") for i in range(3)]

    async def step(events: tuple[Event, ...], seconds: float) -> None:
        nonlocal state, version
        clock.advance(seconds)
        state = fold(decider, state, events)
        version = await event_store.commit(
            db, machine_id=DRAIN, expected_version=version, events=events,
            projection=Projection(state.phase, state.to_json(), state.terminal,
                                  state.wake_keys),
            cause="observation", decision_input={}, now=clock.now(), worker_id="t")

    async def decide(obs: Observation, seconds: float) -> None:
        await step(decider.decide(state, obs, clock.now() + timedelta(seconds=seconds)).events,
                   seconds)

    await decide(node(True), 1)  # Started, NodeCordoned
    await decide(node(True), 1)  # three ChildStarted
    await step((Event("ActionFailed", {
        "at": clock.now().isoformat(), "action": ActionType.SUBMIT_OPERATION,
        "key": submit_key(DRAIN, ids[2]), "params": {}, "error_class": "Refused",
        "message": "pod gone",
        "retryable": False, "attempts": 1}),), 1)
    await decide(node(True, {ids[0]: MachineView(ids[0], "migration", "Succeeded", True),
                             ids[1]: MachineView(ids[1], "migration", "RolledBack", True,
                                                 "RestoreFailed")}), 10)
    await decide(node(True), 1)  # DrainFinished
    assert state.phase == "Failed"

    [drain] = await reports.rows(db, "SELECT * FROM report_drains")
    assert (drain["drain_id"], drain["node"], drain["outcome"]) == (DRAIN, "n1", "Failed")
    assert (drain["children"], drain["succeeded"], drain["failed"], drain["in_flight"]) == (
        3, 1, 2, 0)
    assert abs(float(drain["duration_seconds"]) - 14) < 0.01
    children = await reports.rows(
        db, "SELECT child_id, outcome, reason, duration_seconds FROM report_drain_children "
            "ORDER BY pod")
    assert [(c["outcome"], c["reason"]) for c in children] == [
        ("Succeeded", None), ("RolledBack", "RestoreFailed"), ("Refused", "Refused")]
    assert abs(float(children[0]["duration_seconds"]) - 11) < 0.01
    failures = await reports.rows(
        db, "SELECT reason, children FROM report_drain_failures ORDER BY reason")
    assert [(f["reason"], f["children"]) for f in failures] == [("Refused", 1),
                                                                ("RestoreFailed", 1)]

    # One row per operation: a drain's ChildFinished events are not its end (0006).
    [operation] = await reports.rows(
        db, "SELECT operation_id, duration_seconds FROM report_operations")
    assert operation["operation_id"] == DRAIN
    assert abs(float(operation["duration_seconds"]) - 14) < 0.01
    [by_kind] = await reports.report(db, report="operations", by="kind")
    assert (by_kind["kind"], by_kind["count"], by_kind["failed"]) == ("drain", 1, 1)
    [daily] = await reports.rows(db, "SELECT operations FROM report_daily")
    assert daily["operations"] == 1

    [row] = await reports.report(db, report="drains", by="kind")
    assert (row["drain"], row["node"], row["outcome"]) == (DRAIN, "n1", "Failed")
    assert (row["children"], row["succeeded"], row["failed"], row["in_flight"]) == (3, 1, 2, 0)
    assert row["failures"] == "Refused: 1; RestoreFailed: 1"
    assert row["p50_child_seconds"] is not None
    assert await reports.report(db, report="drains", by="kind",
                                since=clock.now() + timedelta(days=1)) == []
