"""A worker process whose actions never return: it claims machines, commits their first
transition, then hangs in the action — so a ``kill -9`` leaves them all in flight.

``python -m bench.hanging_worker --db URL --concurrency 500 --lease-seconds 5``
"""

from __future__ import annotations

import argparse
import asyncio

from controlplane.clock import SystemClock
from controlplane.engine.decider import Action
from controlplane.machines.catalog import default_kinds
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store.database import open_database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.loop import Worker, WorkerConfig
from controlplane.worker.ports import NullObserver


async def _hang(_action: Action) -> None:
    await asyncio.Event().wait()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--lease-seconds", type=float, default=5.0)
    args = p.parse_args()
    db = open_database(args.db, pool_size=20)
    cfg = WorkerConfig(worker_id="doomed", concurrency=args.concurrency, batch_size=100,
                       lease_seconds=args.lease_seconds, heartbeat_seconds=3600,
                       poll_seconds=0.05)
    runner = ActionRunner({WORK_ACTION: _hang}, RetryPolicy(timeout_seconds=3600))
    await Worker(db, default_kinds(), NullObserver(), runner, SystemClock(), cfg).run()


if __name__ == "__main__":
    asyncio.run(main())
