"""Deterministic scenarios whose recorded histories are checked in as golden files.

``python -m tests.golden.scenarios`` rewrites the JSON files after an intended format
change; the test compares a fresh run with them, so any unintended change to events,
facts, decisions or the replayed state shows up as a diff.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from controlplane.app.operations import send_command
from controlplane.clock import FakeClock
from controlplane.engine.decider import Action
from controlplane.engine.observation import PodView
from controlplane.machines.base.commands import Cancel
from controlplane.store import leases, migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.worker.errors import TerminalActionError
from tests.support.machines import KINDS, submit_steps
from tests.support.workers import RecordingHandler, ScriptedObserver, make_worker

HERE = Path(__file__).parent


async def _tick(db: Database, clock: FakeClock, handler: RecordingHandler,
                observer: ScriptedObserver) -> None:
    worker = make_worker(db, clock, handler, observer, worker_id="golden-worker")
    claimed = await leases.claim_due(db, owner="golden-worker", token=f"t-{clock.now()}",
                                     now=clock.now(), limit=10, lease_seconds=30)
    for c in claimed:
        await worker.drive(c)


async def _refuse_step_2(action: Action) -> None:
    if action.params["step"] == 2:
        raise TerminalActionError("403 Forbidden")


async def record(db: Database) -> dict[str, Any]:
    clock = FakeClock()
    observer = ScriptedObserver()
    handler = RecordingHandler(hook=_refuse_step_2)
    await submit_steps(db, clock, "gated", steps=2, gate_pod="ns/p", gate_pod_uid="uid-1",
                       deadline_seconds=120)
    await submit_steps(db, clock, "refused", steps=3)
    await submit_steps(db, clock, "cancelled", steps=5, gate_pod="ns/q", gate_pod_uid="uid-9")
    await _tick(db, clock, handler, observer)
    clock.advance(5)
    observer.pods["ns/p"] = PodView("ns", "p", "uid-other", "n1", "Running")  # wrong UID
    await leases.wake_by_key(db, key="uid-1", now=clock.now())
    await _tick(db, clock, handler, observer)
    clock.advance(5)
    observer.pods["ns/p"] = PodView("ns", "p", "uid-1", "n1", "Running")
    await leases.wake_by_key(db, key="uid-1", now=clock.now())
    await send_command(db, KINDS, machine_id="cancelled", command=Cancel(),
                       now=clock.now())
    await _tick(db, clock, handler, observer)
    out: dict[str, Any] = {}
    for machine_id in ("gated", "refused", "cancelled"):
        record = await queries.get_machine(db, machine_id)
        out[machine_id] = {
            "events": [{"seq": e.seq, "type": e.type, "data": e.data, "facts": e.facts,
                        "recorded_at": e.recorded_at.isoformat(), "worker_id": e.worker_id}
                       for e in await queries.history(db, machine_id)],
            "decisions": [{"first_seq": d.first_seq, "cause": d.cause.value, "input": d.input,
                           "decided_at": d.decided_at.isoformat()}
                          for d in await queries.decisions(db, machine_id)],
            "final": {"phase": record.phase, "version": record.version, "state": record.state},
        }
    return out


def run_fresh() -> dict[str, Any]:
    async def go(path: Path) -> dict[str, Any]:
        db = open_database(f"sqlite:///{path / 'golden.db'}")
        try:
            await migrate.upgrade(db)
            return await record(db)
        finally:
            await db.dispose()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(go(Path(tmp)))


def golden_path() -> Path:
    return HERE / "steps_histories.json"


if __name__ == "__main__":
    golden_path().write_text(json.dumps(run_fresh(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {golden_path()}")
