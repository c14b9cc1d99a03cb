"""A worker never decides on a machine it cannot read: it leaves it to a newer worker.

During a rolling upgrade an older worker may claim a machine a newer release wrote: a
state with a field or enum value it does not know, a kind it does not run, an outbox
action it has no handler for. The invariants pinned here (both backends):

- the older worker writes nothing about it: no event, no decision, version unchanged,
  the outbox kept (not performed, not recorded as failed), the lease given back and the
  machine due at once;
- it never claims that machine again (no crash loop), logs it once and counts it;
- a worker that can read it then drives it to its end, each action performed once.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update
from structlog.testing import capture_logs

from controlplane.clock import FakeClock
from controlplane.engine.codec import decode
from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry
from controlplane.machines.selftest.steps import WORK_ACTION, StepsDecider, StepsState
from controlplane.store import event_store, leases, queries, schema
from controlplane.store.database import Database
from controlplane.store.records import MachineRecord, Projection
from controlplane.worker.actions import ActionRunner
from controlplane.worker.loop import Worker, WorkerConfig
from controlplane.worker.readable import (
    UNKNOWN_ACTION,
    UNKNOWN_KIND,
    UNKNOWN_STATE,
    Unreadable,
    read_claimed,
)
from tests.support.machines import KINDS
from tests.support.workers import (
    FAST_RETRIES,
    RecordingHandler,
    ScriptedObserver,
    all_terminal,
    make_worker,
    run_until,
)

NOW = FakeClock().now()


class StrictSteps(StepsDecider):
    """The steps kind reading its state through the engine codec, as every product kind
    does (``decode``): a key it does not declare is refused, not dropped."""

    def load_state(self, data: JsonObject) -> StepsState:
        return decode(StepsState, data)


def _worker(db: Database, clock: FakeClock, kinds: KindRegistry,
            handler: RecordingHandler) -> Worker:
    return Worker(db, kinds, ScriptedObserver(),
                  ActionRunner({WORK_ACTION: handler}, FAST_RETRIES), clock,
                  WorkerConfig(worker_id="old", poll_seconds=0.01))


async def _create(db: Database, clock: FakeClock, machine_id: str,
                  **newer: Any) -> None:
    """A steps machine, its state carrying what a newer release added (``newer``)."""
    state = StepsDecider().initial_state(machine_id, {"steps": 2})
    await event_store.create_machine(
        db, machine_id=machine_id, kind="steps", spec={"steps": 2},
        initial=Projection(state.phase, {**state.to_json(), **newer}, False, None),
        now=clock.now(), worker_id="test")


async def _outbox(db: Database, machine_id: str, actions: list[JsonObject]) -> None:
    async with db.writer.begin() as conn:
        await conn.execute(update(schema.machines)
                           .where(schema.machines.c.id == machine_id)
                           .values(pending_actions=actions))


async def _claim_and_drive_once(worker: Worker) -> int:
    """One claim of ``worker`` and the drive of what it claimed; the count claimed."""
    claimed = await worker.claim_batch()
    for claim in claimed:
        await worker.drive(claim)
    return len(claimed)


async def _left_untouched(db: Database, clock: FakeClock, machine_id: str) -> None:
    record = await queries.get_machine(db, machine_id)
    assert record.version == 1
    assert [e.type for e in await queries.history(db, machine_id)] == ["Submitted"]
    assert record.lease_owner is None
    assert record.next_wake_at is not None
    assert record.next_wake_at <= clock.now()
    # Due for any other worker: claimable at once.
    other = await leases.claim_due(db, owner="probe", token="t-probe", now=clock.now(),
                                   limit=5, lease_seconds=30)
    assert [c.record.id for c in other] == [machine_id]
    await leases.leave(db, lease=other[0].lease, now=clock.now())


async def test_a_state_field_this_release_does_not_know_is_left_for_a_newer_worker(
        db: Database, clock: FakeClock) -> None:
    await _create(db, clock, "m1", newer_field={"added": "in a later release"})
    old_handler = RecordingHandler()
    old = _worker(db, clock, KindRegistry([StrictSteps()]), old_handler)
    with capture_logs() as logs:
        assert await _claim_and_drive_once(old) == 1
        assert await _claim_and_drive_once(old) == 0  # never claimed by it again
    await _left_untouched(db, clock, "m1")
    assert old_handler.performed == []
    assert old.metrics.machines_left == {UNKNOWN_STATE: 1}
    assert old.metrics.step_crashes == 0
    left = [e for e in logs if e["event"] == "machine left to a newer worker"]
    assert len(left) == 1
    assert left[0]["machine_id"] == "m1"
    assert "newer_field" in left[0]["detail"]
    rendered = old.metrics.render("old", 0)
    assert ('controlplane_worker_machines_left_total{reason="unreadable_state",'
            'worker="old"} 1') in rendered
    assert 'controlplane_worker_machines_left{worker="old"} 1' in rendered

    # The newer release's worker (here: one that reads the state) ends it.
    newer = RecordingHandler()
    await run_until(make_worker(db, clock, newer, worker_id="new"), all_terminal(db))
    assert newer.performed == ["m1:step:1", "m1:step:2"]
    assert (await queries.get_machine(db, "m1")).phase == "Succeeded"


async def test_an_enum_value_this_release_does_not_know_is_left_not_crashed_on(
        db: Database, clock: FakeClock) -> None:
    await _create(db, clock, "m1", status="Hibernating")
    old = _worker(db, clock, KindRegistry([StrictSteps()]), RecordingHandler())
    assert await _claim_and_drive_once(old) == 1
    assert await _claim_and_drive_once(old) == 0
    await _left_untouched(db, clock, "m1")
    assert old.metrics.machines_left == {UNKNOWN_STATE: 1}
    assert old.metrics.step_crashes == 0


async def test_a_kind_this_release_does_not_run_is_left_for_a_newer_worker(
        db: Database, clock: FakeClock) -> None:
    await _create(db, clock, "m1")
    old = _worker(db, clock, KindRegistry([]), RecordingHandler())
    assert await _claim_and_drive_once(old) == 1
    assert await _claim_and_drive_once(old) == 0
    await _left_untouched(db, clock, "m1")
    assert old.metrics.machines_left == {UNKNOWN_KIND: 1}
    newer = RecordingHandler()
    await run_until(make_worker(db, clock, newer, worker_id="new"), all_terminal(db))
    assert newer.performed == ["m1:step:1", "m1:step:2"]


async def test_an_outbox_action_this_release_has_no_handler_for_is_kept_not_failed(
        db: Database, clock: FakeClock) -> None:
    await _create(db, clock, "m1")
    future = {"type": "FutureAction", "key": "m1:future", "params": {"x": 1}}
    await _outbox(db, "m1", [future])
    old = _worker(db, clock, KINDS, RecordingHandler())
    assert await _claim_and_drive_once(old) == 1
    assert await _claim_and_drive_once(old) == 0
    record = await queries.get_machine(db, "m1")
    assert record.pending_actions == [future]  # kept for the worker that knows it
    assert "ActionFailed" not in [e.type for e in await queries.history(db, "m1")]
    assert old.metrics.machines_left == {UNKNOWN_ACTION: 1}

    performed: list[str] = []

    async def future_action(action: Action) -> None:
        performed.append(action.key)

    handler = RecordingHandler()
    newer = Worker(db, KINDS, ScriptedObserver(),
                   ActionRunner({WORK_ACTION: handler, "FutureAction": future_action},
                                FAST_RETRIES), clock,
                   WorkerConfig(worker_id="new", poll_seconds=0.01))
    await run_until(newer, all_terminal(db))
    assert performed == ["m1:future"]
    assert handler.performed == ["m1:step:1", "m1:step:2"]


async def test_a_left_machine_does_not_keep_the_worker_from_the_others(
        db: Database, clock: FakeClock) -> None:
    """The left machine stays due (the oldest wake first); the worker claims past it."""
    await _create(db, clock, "m0", newer_field=1)
    await _create(db, clock, "m1")
    handler = RecordingHandler()
    old = Worker(db, KindRegistry([StrictSteps()]), ScriptedObserver(),
                 ActionRunner({WORK_ACTION: handler}, FAST_RETRIES), clock,
                 WorkerConfig(worker_id="old", poll_seconds=0.01, batch_size=1,
                              concurrency=1))

    async def m1_done() -> bool:
        return (await queries.get_machine(db, "m1")).terminal

    await run_until(old, m1_done)
    assert handler.performed == ["m1:step:1", "m1:step:2"]
    assert old.metrics.machines_left == {UNKNOWN_STATE: 1}
    assert (await queries.get_machine(db, "m0")).version == 1


@pytest.mark.parametrize(("kind", "newer", "reason"), [
    ("steps", {"newer_field": 1}, UNKNOWN_STATE),
    ("steps", {"status": "Hibernating"}, UNKNOWN_STATE),
    ("steps-v2", {}, UNKNOWN_KIND),
])
def test_read_claimed_names_why_a_machine_cannot_be_read(
        kind: str, newer: dict[str, Any], reason: str) -> None:
    state = StepsDecider().initial_state("m1", {"steps": 2})
    record = MachineRecord(
        id="m1", kind=kind, phase="Running", version=1, spec={"steps": 2},
        state={**state.to_json(), **newer}, terminal=False, pending_actions=[],
        next_wake_at=None, wake_seq=0, lease_owner=None, lease_expires_at=None, attempts=1,
        created_at=NOW, updated_at=NOW,
    )
    with pytest.raises(Unreadable) as raised:
        read_claimed(record, KindRegistry([StrictSteps()]), lambda t: t == WORK_ACTION)
    assert raised.value.reason == reason
