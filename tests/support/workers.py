"""Build workers for tests with recording action handlers and a scripted observer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from controlplane.clock import Clock
from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, Observation, PodView, ProbeError
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store import leases, queries
from controlplane.store.database import Database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.loop import Worker, WorkerConfig
from tests.support.machines import KINDS
from tests.support.waiting import eventually

FAST_RETRIES = RetryPolicy(attempts=3, timeout_seconds=5, backoff_base_seconds=0.001,
                           backoff_max_seconds=0.002)


@dataclass
class RecordingHandler:
    """Records every action it performs; ``hook`` may raise or block to script failures."""

    performed: list[str] = field(default_factory=list)
    hook: Callable[[Action], Awaitable[None]] | None = None

    async def __call__(self, action: Action) -> None:
        if self.hook is not None:
            await self.hook(action)
        self.performed.append(action.key)


@dataclass
class ScriptedObserver:
    """Answers pod interests from dicts the test edits: ``errors`` (a failed probe) first,
    then ``pods`` (absent: the pod does not exist)."""

    pods: dict[str, PodView] = field(default_factory=dict)
    errors: dict[str, ProbeError] = field(default_factory=dict)
    looks: int = 0

    async def observe(self, interests: Interests) -> Observation:
        self.looks += 1
        return Observation(pods={k: self.errors.get(k) or self.pods.get(k)
                                 for k in interests.pods})


def make_worker(db: Database, clock: Clock, handler: RecordingHandler,
                observer: ScriptedObserver | None = None, worker_id: str = "w1",
                confirm: ScriptedObserver | None = None, **config: object) -> Worker:
    cfg = WorkerConfig(worker_id=worker_id, poll_seconds=0.01, **config)  # type: ignore[arg-type]
    return Worker(db, KINDS, observer or ScriptedObserver(),
                  ActionRunner({WORK_ACTION: handler}, FAST_RETRIES), clock, cfg,
                  confirm=confirm)


async def drive_due_once(db: Database, clock: Clock, *, limit: int = 20,
                         observer: ScriptedObserver | None = None) -> None:
    """One pass of a fresh worker over what is due now: claim, and drive each machine."""
    worker = make_worker(db, clock, RecordingHandler(), observer)
    for claim in await leases.claim_due(db, owner="w1", token="t", now=clock.now(),
                                        limit=limit, lease_seconds=30):
        await worker.drive(claim)


async def run_until(worker: Worker, done: Callable[[], Awaitable[bool]],
                    limit_seconds: float = 30.0) -> None:
    """Run ``worker`` until ``done()`` holds (checked every 10 ms), then stop it."""
    task = asyncio.create_task(worker.run())

    async def reached() -> bool:
        if task.done():
            task.result()
            raise AssertionError("worker stopped before the condition held")
        return await done()

    try:
        await eventually(reached, limit_seconds=limit_seconds, every=0.01)
    finally:
        worker.stop()
        await task


def all_terminal(db: Database) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        live = await queries.list_machines(db, queries.MachineFilter(settled=False, limit=1))
        return not live
    return check
