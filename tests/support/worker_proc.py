"""A worker process for crash tests: ``python -m tests.support.worker_proc --db URL ...``.

Its action handler appends each performed action key to ``--log`` (fsynced), so a test
can count side effects across processes. Files in ``--control`` script where it hangs, so
the test can SIGKILL it at a known point:

- ``hang-action-<step>``: the first time step <step>'s action runs, write
  ``entered-action-<step>`` and block forever (the kill lands mid-action, after commit);
- ``slow-action-<step>``: step <step>'s action writes ``entered-slow-<step>`` and takes
  one second (a SIGTERM then lands while it is in flight);
- ``hang-observe``: observing a gate pod writes ``entered-observe`` and blocks (the kill
  lands mid-transition, before its commit).
The observer reports every gate pod with the UID the machine waits for, Pending until the
file ``gate-open`` exists, then Running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from controlplane.clock import SystemClock
from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, Observation, PodView
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store.database import open_database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.loop import Worker, WorkerConfig
from tests.support.machines import KINDS

GATE_UID_PREFIX = "uid-"


class FileLoggingHandler:
    def __init__(self, log: Path, control: Path) -> None:
        self.log, self.control = log, control

    async def __call__(self, action: Action, /) -> None:
        step = action.params["step"]
        if (self.control / f"hang-action-{step}").exists():
            marker = self.control / f"entered-action-{step}"
            if not marker.exists():
                marker.write_text(action.key)
                await asyncio.Event().wait()  # blocks until SIGKILL
        if (self.control / f"slow-action-{step}").exists():
            (self.control / f"entered-slow-{step}").write_text(action.key)
            await asyncio.sleep(1.0)
        with self.log.open("a") as fh:
            fh.write(action.key + "\n")
            fh.flush()
            os.fsync(fh.fileno())


class GateObserver:
    def __init__(self, control: Path) -> None:
        self.control = control

    async def observe(self, interests: Interests) -> Observation:
        if (self.control / "hang-observe").exists():
            (self.control / "entered-observe").write_text("1")
            await asyncio.Event().wait()
        pods = {}
        for key in interests.pods:
            ns, name = key.split("/")
            phase = "Running" if (self.control / "gate-open").exists() else "Pending"
            pods[key] = PodView(ns, name, GATE_UID_PREFIX + name, "node-a", phase)
        return Observation(pods=pods)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--control", type=Path, required=True)
    p.add_argument("--lease-seconds", type=float, default=1.5)
    args = p.parse_args()
    db = open_database(args.db, pool_size=12)
    cfg = WorkerConfig(worker_id=args.worker_id, concurrency=8, batch_size=8,
                       lease_seconds=args.lease_seconds,
                       heartbeat_seconds=args.lease_seconds / 3, poll_seconds=0.02)
    runner = ActionRunner({WORK_ACTION: FileLoggingHandler(args.log, args.control)},
                          RetryPolicy(attempts=3, backoff_base_seconds=0.01))
    worker = Worker(db, KINDS, GateObserver(args.control), runner, SystemClock(), cfg)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    try:
        await worker.run()
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(main())
