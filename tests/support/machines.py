"""Helpers to create and read machines in store tests."""

from __future__ import annotations

from controlplane.clock import FakeClock
from controlplane.engine.kinds import KindRegistry
from controlplane.machines.steps import StepsDecider
from controlplane.operations import submit
from controlplane.store.database import Database

KINDS = KindRegistry([StepsDecider()])


async def submit_steps(db: Database, clock: FakeClock, machine_id: str, steps: int = 3,
                       **extra: object) -> str:
    spec: dict[str, object] = {"steps": steps, **extra}
    return await submit(db, KINDS, kind="steps", spec=spec,  # type: ignore[arg-type]
                        machine_id=machine_id, now=clock.now())
