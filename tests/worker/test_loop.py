"""The worker drives machines through observe -> decide -> commit -> act (both backends)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from controlplane.clock import FakeClock
from controlplane.engine.decider import Action
from controlplane.engine.observation import PodView, ProbeError
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store import leases, queries
from controlplane.store.database import Database
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from tests.support.machines import submit_steps
from tests.support.waiting import eventually
from tests.support.workers import (
    RecordingHandler,
    ScriptedObserver,
    all_terminal,
    drive_due_once,
    make_worker,
    run_until,
)


async def test_a_machine_is_driven_to_success_with_each_action_once_in_order(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1", steps=4)
    handler = RecordingHandler()
    await run_until(make_worker(db, clock, handler), all_terminal(db))
    record = await queries.get_machine(db, "m1")
    assert (record.phase, record.terminal, record.version) == ("Succeeded", True, 5)
    assert handler.performed == [f"m1:step:{i}" for i in range(1, 5)]
    history = await queries.history(db, "m1")
    assert [e.data.get("step") for e in history[1:]] == [1, 2, 3, 4]
    assert record.lease_owner is None
    assert record.next_wake_at is None


async def test_a_terminal_action_error_becomes_an_event_and_fails_the_machine(
    db: Database, clock: FakeClock
) -> None:
    async def refuse(action: Action) -> None:
        if action.params["step"] == 2:
            raise TerminalActionError("403 Forbidden: DELETE manifest")

    await submit_steps(db, clock, "m1", steps=4)
    worker = make_worker(db, clock, RecordingHandler(hook=refuse))
    await run_until(worker, all_terminal(db))
    assert worker.metrics.action_failures == {(WORK_ACTION, "Terminal"): 1}
    history = await queries.history(db, "m1")
    failed = [e for e in history if e.type == "ActionFailed"]
    assert len(failed) == 1
    assert failed[0].data["key"] == "m1:step:2"
    assert failed[0].data["retryable"] is False
    assert failed[0].facts == {"error_class": "Terminal"}
    record = await queries.get_machine(db, "m1")
    assert record.phase == "Failed"
    assert "403 Forbidden" in str(record.state["reason"])


async def test_retryable_errors_are_retried_without_polluting_history(
    db: Database, clock: FakeClock
) -> None:
    attempts: list[int] = []

    async def flaky(action: Action) -> None:
        if action.params["step"] == 1 and len(attempts) < 2:
            attempts.append(1)
            raise RetryableActionError("503 from the API server")

    await submit_steps(db, clock, "m1", steps=2)
    handler = RecordingHandler(hook=flaky)
    await run_until(make_worker(db, clock, handler), all_terminal(db))
    assert len(attempts) == 2
    assert handler.performed == ["m1:step:1", "m1:step:2"]
    assert "ActionFailed" not in [e.type for e in await queries.history(db, "m1")]


async def test_exhausted_retries_are_recorded_as_retryable_failures(
    db: Database, clock: FakeClock
) -> None:
    async def down(action: Action) -> None:
        raise RetryableActionError("registry 503")

    await submit_steps(db, clock, "m1", steps=1)
    await run_until(make_worker(db, clock, RecordingHandler(hook=down)), all_terminal(db))
    failed = [e for e in await queries.history(db, "m1") if e.type == "ActionFailed"]
    assert [(f.data["retryable"], f.data["attempts"]) for f in failed] == [(True, 3)]


async def test_a_gated_machine_sleeps_until_woken_by_its_pod_uid(
    db: Database, clock: FakeClock
) -> None:
    """No polling: the machine decides again only when a wake names its key."""
    await submit_steps(db, clock, "g1", steps=1, gate_pod="ns/p", gate_pod_uid="uid-1")
    observer = ScriptedObserver()
    worker = make_worker(db, clock, RecordingHandler(), observer)

    async def sleeping() -> bool:
        r = await queries.get_machine(db, "g1")
        return r.state["deadline"] is not None and r.lease_owner is None

    await run_until(worker, sleeping)
    record = await queries.get_machine(db, "g1")
    assert record.phase == "Waiting"
    assert record.next_wake_at is not None
    assert record.next_wake_at > clock.now()

    observer.pods["ns/p"] = PodView("ns", "p", "uid-1", "node-a", "Running", ready=True)
    assert await leases.wake_by_key(db, key="uid-1", now=clock.now()) == 1
    await run_until(make_worker(db, clock, RecordingHandler(), observer), all_terminal(db))
    history = await queries.history(db, "g1")
    opened = next(e for e in history if e.type == "GateOpened")
    assert opened.facts == {"pod_uid": "uid-1", "pod_phase": "Running"}
    assert (await queries.get_machine(db, "g1")).phase == "Succeeded"


async def test_a_pod_recreated_under_the_same_name_does_not_open_the_gate(
    db: Database, clock: FakeClock
) -> None:
    """UID provenance: same name, other UID, is not the pod we wait for."""
    await submit_steps(db, clock, "g1", steps=1, gate_pod="ns/p", gate_pod_uid="uid-1",
                       deadline_seconds=60)
    observer = ScriptedObserver({"ns/p": PodView("ns", "p", "uid-2", "node-a", "Running")})
    worker = make_worker(db, clock, RecordingHandler(), observer)

    async def armed() -> bool:
        r = await queries.get_machine(db, "g1")
        return r.state["deadline"] is not None and r.lease_owner is None

    await run_until(worker, armed)
    clock.advance(61)  # the hang guard fires at its deadline
    await run_until(make_worker(db, clock, RecordingHandler(), observer), all_terminal(db))
    record = await queries.get_machine(db, "g1")
    assert record.phase == "Failed"
    assert "GateOpened" not in [e.type for e in await queries.history(db, "g1")]


async def test_a_failed_probe_is_looked_at_again_soon_not_at_the_deadline(
    db: Database, clock: FakeClock
) -> None:
    """A 429 on the one read that would have shown the change must not leave the machine
    asleep until its hang guard: nothing may ever wake it (reliability bug 6)."""
    await submit_steps(db, clock, "g1", steps=1, gate_pod="ns/p", gate_pod_uid="uid-1")
    throttled = ProbeError("TooManyRequests", "injected 429")
    observer = ScriptedObserver(errors={"ns/p": throttled})

    async def released() -> bool:
        r = await queries.get_machine(db, "g1")
        return r.state["deadline"] is not None and r.lease_owner is None

    await run_until(make_worker(db, clock, RecordingHandler(), observer), released)
    record = await queries.get_machine(db, "g1")
    assert record.phase == "Waiting"
    assert record.next_wake_at == clock.now() + timedelta(seconds=2)  # not the 3600 s guard

    # The pod runs now and the read succeeds; no wake names it: only the retry finds it.
    del observer.errors["ns/p"]
    observer.pods["ns/p"] = PodView("ns", "p", "uid-1", "node-a", "Running", ready=True)
    clock.advance(2)
    await run_until(make_worker(db, clock, RecordingHandler(), observer), all_terminal(db))
    assert (await queries.get_machine(db, "g1")).phase == "Succeeded"


async def test_consecutive_failed_probes_back_off_and_a_clean_look_resets_it(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "g1", steps=1, gate_pod="ns/p", gate_pod_uid="uid-1")
    observer = ScriptedObserver(errors={"ns/p": ProbeError("Timeout", "no answer")})
    await drive_due_once(db, clock, observer=observer)  # arms the gate, looks once
    delays = []
    for _ in range(6):
        record = await queries.get_machine(db, "g1")
        assert record.next_wake_at is not None
        delays.append((record.next_wake_at - clock.now()).total_seconds())
        clock.current = record.next_wake_at
        await drive_due_once(db, clock, observer=observer)
    assert delays == [2, 4, 8, 16, 30, 30]

    # A clean look (the pod not there yet) sleeps to the guard, and resets the backoff.
    del observer.errors["ns/p"]
    clock.advance(30)
    await drive_due_once(db, clock, observer=observer)
    record = await queries.get_machine(db, "g1")
    assert record.next_wake_at == datetime.fromisoformat(record.state["deadline"])
    observer.errors["ns/p"] = ProbeError("Timeout", "no answer")
    await leases.wake_by_key(db, key="uid-1", now=clock.now())
    await drive_due_once(db, clock, observer=observer)
    record = await queries.get_machine(db, "g1")
    assert record.next_wake_at == clock.now() + timedelta(seconds=2)


async def test_a_worker_whose_lease_expired_mid_action_cannot_commit_again(
    db: Database, clock: FakeClock
) -> None:
    """Two workers racing on one machine never both commit a transition."""
    await submit_steps(db, clock, "m1", steps=3)
    entered, release = asyncio.Event(), asyncio.Event()

    async def stall_first_action(action: Action) -> None:
        if action.params["step"] == 1 and not entered.is_set():
            entered.set()
            await release.wait()

    slow = make_worker(db, clock, RecordingHandler(hook=stall_first_action), worker_id="slow",
                       lease_seconds=30, heartbeat_seconds=3600)
    slow_task = asyncio.create_task(slow.run())
    await asyncio.wait_for(entered.wait(), 10)
    slow.stop()  # claims nothing more; its one machine stays stuck in the action
    clock.advance(31)  # the slow worker's lease expires while it is stuck in an action
    fast_handler = RecordingHandler()
    await run_until(make_worker(db, clock, fast_handler, worker_id="fast"), all_terminal(db))
    release.set()
    slow.stop()
    await slow_task
    history = await queries.history(db, "m1")
    assert [(e.seq, e.type, e.data.get("step")) for e in history] == [
        (1, "Submitted", None), (2, "StepCompleted", 1), (3, "StepCompleted", 2),
        (4, "StepCompleted", 3)]
    assert {e.worker_id for e in history[2:]} == {"fast"}
    assert (slow.metrics.lease_losses, slow.metrics.conflicts) == (1, 0)  # fenced, counted
    # The stalled action re-ran under the new owner: at-least-once, idempotent by key.
    assert fast_handler.performed == ["m1:step:1", "m1:step:2", "m1:step:3"]


async def test_many_machines_across_two_workers_each_get_every_step_exactly_once(
    db: Database, clock: FakeClock
) -> None:
    for i in range(30):
        await submit_steps(db, clock, f"m{i:02d}", steps=5)
    a = make_worker(db, clock, RecordingHandler(), worker_id="a", concurrency=8, batch_size=4)
    b = make_worker(db, clock, RecordingHandler(), worker_id="b", concurrency=8, batch_size=4)
    task_b = asyncio.create_task(b.run())
    await run_until(a, all_terminal(db))
    b.stop()
    await task_b
    for i in range(30):
        history = await queries.history(db, f"m{i:02d}")
        assert [e.data.get("step") for e in history[1:]] == [1, 2, 3, 4, 5]
    assert a.transitions + b.transitions == 150


async def test_stop_drains_in_flight_work_and_releases_leases(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1", steps=2)
    entered, go = asyncio.Event(), asyncio.Event()

    async def hold(action: Action) -> None:
        entered.set()
        await go.wait()

    worker = make_worker(db, clock, RecordingHandler(hook=hold))
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(entered.wait(), 10)
    worker.stop()
    go.set()
    await asyncio.wait_for(task, 10)
    record = await queries.get_machine(db, "m1")
    assert record.lease_owner is None  # released, not left to expire


async def test_a_worker_fills_every_slot_even_when_batches_are_small(
    db: Database, clock: FakeClock
) -> None:
    """Claim pacing never leaves free slots idle while machines are due."""
    for i in range(10):
        await submit_steps(db, clock, f"m{i}", steps=1)
    stuck = asyncio.Event()

    async def hang(action: Action) -> None:
        await stuck.wait()

    worker = make_worker(db, clock, RecordingHandler(hook=hang), concurrency=10, batch_size=3)

    async def all_leased() -> bool:
        machines = await queries.list_machines(db, queries.MachineFilter())
        if all(m.lease_owner == "w1" for m in machines):
            stuck.set()  # let the actions finish so the worker can drain
            return True
        return False

    task = asyncio.create_task(worker.run())
    try:
        await eventually(all_leased, limit_seconds=20)
    finally:
        stuck.set()
        worker.stop()
        await task


def _stale_and_fresh() -> tuple[ScriptedObserver, ScriptedObserver]:
    """The watch cache still holds the gate pod ``Pending``; the API server has it Running
    (a resumed watch that said "synced" before applying its backlog)."""
    cache = ScriptedObserver({"ns/p": PodView("ns", "p", "uid-1", "node-a", "Pending")})
    server = ScriptedObserver({"ns/p": PodView("ns", "p", "uid-1", "node-a", "Running")})
    return cache, server


async def _armed_then_past_deadline(db: Database, clock: FakeClock,
                                    cache: ScriptedObserver) -> None:
    await submit_steps(db, clock, "g1", steps=1, gate_pod="ns/p", gate_pod_uid="uid-1",
                       deadline_seconds=60)

    async def armed() -> bool:
        r = await queries.get_machine(db, "g1")
        return r.state["deadline"] is not None and r.lease_owner is None

    await run_until(make_worker(db, clock, RecordingHandler(), cache), armed)
    clock.advance(61)


async def test_a_decision_that_ends_a_machine_is_taken_on_a_fresh_read_not_the_cache(
    db: Database, clock: FakeClock
) -> None:
    cache, server = _stale_and_fresh()
    await _armed_then_past_deadline(db, clock, cache)
    worker = make_worker(db, clock, RecordingHandler(), cache, confirm=server)
    await run_until(worker, all_terminal(db))
    history = [e.type for e in await queries.history(db, "g1")]
    assert "GateOpened" in history
    assert "GateTimedOut" not in history
    assert (await queries.get_machine(db, "g1")).phase == "Succeeded"
    assert server.looks == 1  # one read through, for the one decision that would end it
    assert (worker.metrics.confirmations, worker.metrics.overturned) == (1, 1)


async def test_without_a_confirming_read_the_stale_cache_would_have_failed_it(
    db: Database, clock: FakeClock
) -> None:
    """The control for the test above: the same cache alone times the gate out."""
    cache, _ = _stale_and_fresh()
    await _armed_then_past_deadline(db, clock, cache)
    await run_until(make_worker(db, clock, RecordingHandler(), cache), all_terminal(db))
    assert (await queries.get_machine(db, "g1")).phase == "Failed"
