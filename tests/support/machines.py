"""Helpers to create and read machines in store tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from controlplane.app.operations import submit
from controlplane.clock import FakeClock
from controlplane.engine.decider import Decision
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import Observation
from controlplane.machines.selftest.steps import StepsDecider, StepsState
from controlplane.store.database import Database

KINDS = KindRegistry([StepsDecider()])


class DriftedSteps(StepsDecider):
    """A 'new release' of the steps kind that would write different history."""

    def decide(self, state: StepsState, observation: Observation, now: datetime) -> Decision:
        decision = super().decide(state, observation, now)
        return replace(decision, events=tuple(replace(e, data={**e.data, "payload": "changed"})
                                              for e in decision.events))


async def submit_steps(db: Database, clock: FakeClock, machine_id: str, steps: int = 3,
                       **extra: object) -> str:
    spec: dict[str, object] = {"steps": steps, **extra}
    return await submit(db, KINDS, kind="steps", spec=spec,  # type: ignore[arg-type]
                        machine_id=machine_id, now=clock.now())
