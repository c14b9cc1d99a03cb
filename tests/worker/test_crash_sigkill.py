"""SIGKILL a real worker process at chosen and random moments; nothing is lost or doubled.

Each test runs worker subprocesses (``tests.support.worker_proc``) against a real
database file or server, kills them with ``kill -9``, and lets another worker finish
after the lease expires. Invariants: every machine terminal with exactly the expected
events (no gap, no duplicate), every committed action performed at least once.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from controlplane.clock import SystemClock
from controlplane.store import leases, queries
from controlplane.store.database import Database
from tests.support.machines import KINDS
from tests.support.stopping import stop_processes
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
clock = SystemClock()


class Fleet:
    """Worker subprocesses sharing one action log and one control directory."""

    def __init__(self, db_url: str, tmp: Path) -> None:
        self.db_url, self.log, self.control = db_url, tmp / "actions.log", tmp / "control"
        self.control.mkdir()
        self.log.touch()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stderr_dir = tmp

    def start(self, name: str) -> subprocess.Popen[bytes]:
        with (self.stderr_dir / f"{name}.stderr").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.worker_proc", "--db", self.db_url,
                 "--worker-id", name, "--log", str(self.log), "--control", str(self.control)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
            )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        stop_processes(self.procs)

    def performed(self) -> Counter[str]:
        return Counter(line for line in self.log.read_text().splitlines() if line)


async def _wait_for(marker: Path, proc: subprocess.Popen[bytes]) -> None:
    def reached() -> bool:
        assert proc.poll() is None, "worker exited before reaching the kill point"
        return os.path.exists(marker)

    await eventually(reached, what=f"{marker.name}")


async def _wait_all_terminal(db: Database) -> None:
    async def done() -> bool:
        return not await queries.list_machines(db, queries.MachineFilter(settled=False,
                                                                         limit=1))

    await eventually(done, limit_seconds=90, every=0.05)


async def _asleep(db: Database, machine_id: str, version: int) -> bool:
    r = await queries.get_machine(db, machine_id)
    return r.version >= version and r.lease_owner is None


async def _submit(db: Database, machine_id: str, **spec: object) -> None:
    from controlplane.app.operations import submit

    await submit(db, KINDS, kind="steps", spec=spec,  # type: ignore[arg-type]
                 machine_id=machine_id, now=clock.now())


async def _assert_exact_histories(db: Database, steps: dict[str, int]) -> None:
    for machine_id, n in steps.items():
        history = await queries.history(db, machine_id)
        completed = [e.data["step"] for e in history if e.type == "StepCompleted"]
        assert completed == list(range(1, n + 1)), (machine_id, completed)
        assert [e.seq for e in history] == list(range(1, len(history) + 1))
        assert (await queries.get_machine(db, machine_id)).phase == "Succeeded"


@pytest.mark.parametrize("kill_at_step", [2, 3], ids=["mid-run", "terminal-commit"])
async def test_kill_mid_action_after_commit_the_next_worker_performs_the_action(
    db: Database, db_url: str, tmp_path: Path, kill_at_step: int
) -> None:
    """The outbox: a decision committed but not acted on is acted on by the next owner —
    also when that decision made the machine terminal."""
    await _submit(db, "m1", steps=3)
    fleet = Fleet(db_url, tmp_path)
    (fleet.control / f"hang-action-{kill_at_step}").touch()
    first = fleet.start("first")
    try:
        await _wait_for(fleet.control / f"entered-action-{kill_at_step}", first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert (await queries.get_machine(db, "m1")).version == kill_at_step + 1  # committed
        fleet.start("second")

        async def all_performed() -> bool:
            return len(fleet.performed()) == 3

        await eventually(all_performed)
        await _wait_all_terminal(db)
    finally:
        fleet.stop_all()
    await _assert_exact_histories(db, {"m1": 3})
    assert fleet.performed() == Counter({"m1:step:1": 1, "m1:step:2": 1, "m1:step:3": 1})
    history = await queries.history(db, "m1")
    assert [e.worker_id for e in history[1:]] == ["first"] * kill_at_step + ["second"] * (
        3 - kill_at_step)
    assert (await queries.get_machine(db, "m1")).next_wake_at is None  # released for good


async def test_kill_mid_transition_before_commit_loses_nothing_and_doubles_nothing(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    await _submit(db, "g1", steps=2, gate_pod="ns/gate", gate_pod_uid="uid-gate")
    fleet = Fleet(db_url, tmp_path)
    first = fleet.start("first")
    try:
        # It arms the gate's deadline and goes to sleep: the gate pod is still Pending.
        await eventually(lambda: _asleep(db, "g1", 2))
        # The pod starts (as a watch event would report): the wake makes the worker
        # observe again, and that observation hangs — the kill lands before any commit.
        (fleet.control / "hang-observe").touch()
        (fleet.control / "gate-open").touch()
        await leases.wake_by_key(db, key="uid-gate", now=clock.now())
        await _wait_for(fleet.control / "entered-observe", first)
        before = await queries.history(db, "g1")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        (fleet.control / "hang-observe").unlink()
        fleet.start("second")
        await _wait_all_terminal(db)
    finally:
        fleet.stop_all()
    after = await queries.history(db, "g1")
    assert after[: len(before)] == before  # nothing committed was touched
    assert [e.type for e in after] == ["Submitted", "GateArmed", "GateOpened",
                                       "StepCompleted", "StepCompleted"]
    assert fleet.performed() == Counter({"g1:step:1": 1, "g1:step:2": 1})


async def test_random_sigkills_of_two_workers_leave_every_history_exact(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "7")))
    steps = {f"m{i:03d}": 6 for i in range(40)}
    for machine_id, n in steps.items():
        await _submit(db, machine_id, steps=n)
    fleet = Fleet(db_url, tmp_path)
    live = [fleet.start("w0"), fleet.start("w1")]
    kills = 0
    try:
        for round_no in range(4):
            await asyncio.sleep(rng.uniform(0.2, 0.8))  # chaos timing, not a race we assert on
            victim = live.pop(rng.randrange(len(live)))
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            kills += 1
            live.append(fleet.start(f"w{round_no + 2}"))
        await _wait_all_terminal(db)
    finally:
        fleet.stop_all()
    await _assert_exact_histories(db, steps)
    performed = fleet.performed()
    expected_keys = {f"{m}:step:{s}" for m, n in steps.items() for s in range(1, n + 1)}
    assert set(performed) == expected_keys  # every action at least once, nothing foreign
    repeats = sum(performed.values()) - len(expected_keys)
    print(f"crash campaign: {len(steps)} machines, {kills} SIGKILLs, "
          f"{repeats} idempotent action repeats")


async def test_sigterm_finishes_the_step_in_flight_and_releases_the_lease(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    """Graceful shutdown: the in-flight action completes, the lease is handed back (not
    left to expire), and the process exits 0; the next worker continues at once."""
    await _submit(db, "m1", steps=3)
    fleet = Fleet(db_url, tmp_path)
    (fleet.control / "slow-action-1").touch()
    first = fleet.start("first")
    try:
        await _wait_for(fleet.control / "entered-slow-1", first)
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        record = await queries.get_machine(db, "m1")
        assert record.lease_owner is None  # released, so no wait for lease expiry
        assert record.version == 2  # it stopped after the step in flight
        assert fleet.performed() == Counter({"m1:step:1": 1})
        fleet.start("second")
        await _wait_all_terminal(db)
    finally:
        fleet.stop_all()
    await _assert_exact_histories(db, {"m1": 3})
    assert fleet.performed() == Counter({"m1:step:1": 1, "m1:step:2": 1, "m1:step:3": 1})
