"""Replay rebuilds projections exactly, and ``verify`` catches a decider that changed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.app.operations import send_command
from controlplane.app.replay import rebuild, verify
from controlplane.clock import FakeClock
from controlplane.engine.decider import Event
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import PodView
from controlplane.errors import UsageError
from controlplane.machines.base.commands import Cancel
from controlplane.machines.selftest.steps import StepsDecider, StepsState
from controlplane.store import leases, migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.store.records import Projection
from controlplane.store.replay_writes import rewrite_projection
from tests.support.machines import KINDS, DriftedSteps, submit_steps
from tests.support.workers import (
    RecordingHandler,
    ScriptedObserver,
    drive_due_once,
    make_worker,
)

op = st.one_of(
    st.tuples(st.just("tick"), st.integers(1, 4)),
    st.tuples(st.just("cancel"), st.integers(0, 5)),
    st.tuples(st.just("pod"), st.integers(0, 5), st.sampled_from(["Running", "Pending", "gone",
                                                                   "other-uid"])),
    st.tuples(st.just("advance"), st.integers(1, 400)),
)


async def _run_program(db: Database, clock: FakeClock, machines: list[tuple[int, bool]],
                       program: list[tuple[object, ...]]) -> None:
    observer = ScriptedObserver()
    worker = make_worker(db, clock, RecordingHandler(), observer, max_steps_per_lease=2)
    for i, (steps, gated) in enumerate(machines):
        extra = {"gate_pod": f"ns/p{i}", "gate_pod_uid": f"u{i}", "deadline_seconds": 600}
        await submit_steps(db, clock, f"m{i}", steps=steps, **(extra if gated else {}))
    for step in program:
        kind = step[0]
        if kind == "tick":
            limit = step[1]
            assert isinstance(limit, int)
            claimed = await leases.claim_due(db, owner="w1", token=f"t{clock.now()}{limit}",
                                             now=clock.now(), limit=limit, lease_seconds=30)
            for c in claimed:
                await worker.drive(c)
        elif kind == "cancel":
            # Unknown or already terminal: refused with UsageError, and nothing written.
            with contextlib.suppress(UsageError):
                await send_command(db, KINDS, machine_id=f"m{step[1]}",
                                   command=Cancel(), now=clock.now())
        elif kind == "pod":
            idx, phase = step[1], step[2]
            key = f"ns/p{idx}"
            if phase == "gone":
                observer.pods.pop(key, None)
            else:
                uid = "someone-else" if phase == "other-uid" else f"u{idx}"
                observer.pods[key] = PodView("ns", f"p{idx}", uid, "n1",
                                             "Running" if phase == "other-uid" else str(phase))
            await leases.wake_by_key(db, key=f"u{idx}", now=clock.now())
        else:
            assert isinstance(step[1], int)
            clock.advance(step[1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=6),
       program=st.lists(op, max_size=30))
def test_replaying_any_history_reproduces_the_projection_and_every_decision(
    machines: list[tuple[int, bool]], program: list[tuple[object, ...]]
) -> None:
    """Whatever interleaving of decisions, commands, wakes and time: events fold to the
    stored projection, and re-running each recorded decision yields the same events."""

    async def scenario(path: Path) -> None:
        db = open_database(f"sqlite:///{path / 'replay.db'}")
        try:
            await migrate.upgrade(db)
            clock = FakeClock()
            await _run_program(db, clock, machines, program)
            projections = await rebuild(db, KINDS, now=clock.now())
            decisions = await verify(db, KINDS)
            assert projections.mismatches == []
            assert decisions.mismatches == []
            assert projections.machines == len(machines)
        finally:
            await db.dispose()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


async def test_a_corrupted_projection_is_detected_and_rebuilt_from_events(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1", steps=2)
    await submit_steps(db, clock, "m2", steps=2)
    await drive_due_once(db, clock, limit=5)
    good = await queries.get_machine(db, "m1")
    # Corrupt m1's projection behind the engine's back (as a bad manual UPDATE would).
    bad_state = dict(good.state, done=0)
    await rewrite_projection(db, machine_id="m1", version=good.version, now=clock.now(),
                             projection=Projection("Running", bad_state, False))
    report = await rebuild(db, KINDS, now=clock.now())
    assert {(m.machine_id, m.what) for m in report.mismatches} == {("m1", "state"),
                                                                   ("m1", "phase"),
                                                                   ("m1", "terminal")}
    fixed = await rebuild(db, KINDS, now=clock.now(), write=True)
    assert fixed.rewritten == 1
    assert (await rebuild(db, KINDS, now=clock.now())).clean
    assert (await queries.get_machine(db, "m1")).state == good.state


async def test_verify_reports_a_decider_that_no_longer_reproduces_its_history(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1", steps=3)
    await drive_due_once(db, clock, limit=5)
    assert (await verify(db, KINDS)).clean
    report = await verify(db, KindRegistry([DriftedSteps()]))
    assert [(m.machine_id, m.seq) for m in report.mismatches] == [("m1", 2), ("m1", 3),
                                                                  ("m1", 4)]


class CollectorProbe(StepsDecider):
    """Records whether the cyclic garbage collector ran during each fold step."""

    def __init__(self) -> None:
        self.collector_enabled: list[bool] = []

    def evolve(self, state: StepsState, event: Event) -> StepsState:
        self.collector_enabled.append(gc.isenabled())
        return super().evolve(state, event)


async def test_rebuild_folds_without_the_cyclic_collector_and_restores_it(
    db: Database, clock: FakeClock
) -> None:
    await submit_steps(db, clock, "m1", steps=2)
    await drive_due_once(db, clock, limit=5)
    probe = CollectorProbe()
    assert gc.isenabled()
    report = await rebuild(db, KindRegistry([probe]), now=clock.now())
    assert report.clean
    assert report.events > 1
    assert probe.collector_enabled
    assert not any(probe.collector_enabled)
    assert gc.isenabled()
