"""A drain recorded in the store as the real drain decider writes it, with no cluster: three
children on ``n1`` (one succeeded, one rolled back, one refused), the drain settled
(:func:`make_drain`, :data:`DRAIN` its id). Times come from the caller's clock, so a test
puts the history in the past. Used by ``tests/store/test_retention.py`` and
``tests/store/test_retention_housekeeping.py``.
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
from controlplane.store import event_store
from controlplane.store.database import Database
from controlplane.store.records import Projection

TEMPLATE = {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
DRAIN = "drain-r"


async def make_drain(db: Database, clock: FakeClock) -> None:
    """A drain of three children: one succeeded, one rolled back, one refused."""
    spec: dict[str, Any] = {"node": "n1", "max_parallel": 3, "class": {
        "repository": "localhost:5000/r"}, "children": [
            {"pod": {"namespace": "d", "name": f"p{i}", "uid": f"u{i}"}, "target": "n2",
             "template": TEMPLATE} for i in range(3)]}
    await submit(db, default_kinds(), kind="drain", spec=spec, machine_id=DRAIN,
                 now=clock.now(), requester="alice@host")
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

    def node(cordoned: bool, children: dict[str, MachineView] | None = None) -> Observation:
        return Observation(nodes={"n1": NodeView("n1", True, cordoned)},
                           machines=dict(children or {}))

    async def decide(obs: Observation, seconds: float) -> None:
        await step(decider.decide(state, obs, clock.now() + timedelta(seconds=seconds)).events,
                   seconds)

    await decide(node(True), 1)
    await decide(node(True), 1)
    await step((Event("ActionFailed", {
        "at": clock.now().isoformat(), "action": ActionType.SUBMIT_OPERATION,
        "key": submit_key(DRAIN, ids[2]), "params": {}, "error_class": "Refused",
        "message": "pod gone", "retryable": False, "attempts": 1}),), 1)
    await decide(node(True, {ids[0]: MachineView(ids[0], "migration", "Succeeded", True),
                             ids[1]: MachineView(ids[1], "migration", "RolledBack", True,
                                                 "RestoreFailed")}), 10)
    await decide(node(True), 1)
    assert state.terminal
