"""Engine benchmark: transitions/s through the full engine path, and crash recovery.

``python -m bench.engine_throughput`` (or ``make bench``) on the local PostgreSQL:

1. floor: bare single-row INSERT+COMMIT per second on the same server, same run, at
   concurrency 1 and 32, so every figure reads as a ratio;
2. throughput: ``steps`` machines of 7 phases / 6 transitions, ~200 B payload, driven by
   one in-process worker (claim + observe + decide + commit + no-op action + release) at
   concurrency 1 and 32: transitions/s and p50/p99 commit latency;
3. recovery: a worker subprocess claims N machines, commits their first transition and
   hangs in the action; ``kill -9``; a fresh worker must resume all within 3 s of lease
   expiry. Prints seconds from lease expiry until all resumed and until all finished.

Prints a table and one JSON line; writes ``bench/results/engine_throughput.json`` (or
``--json FILE``), like every scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import ROOT, db_name, floor, fresh_database, until_all_terminal, write_results
from controlplane.app.operations import submit
from controlplane.clock import SystemClock, new_id
from controlplane.logs import configure as configure_logs
from controlplane.machines.catalog import default_kinds
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store import leases, migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.worker import loop
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.loop import Worker, WorkerConfig
from controlplane.worker.ports import NullObserver

clock = SystemClock()


async def _noop(_action: Any) -> None:
    return None


async def throughput(db: Database, machines: int, concurrency: int) -> dict[str, float]:
    kinds = default_kinds()
    for _ in range(machines):
        await submit(db, kinds, kind="steps", spec={"steps": 6, "payload_bytes": 200},
                     machine_id=new_id(), now=clock.now())
    latencies: list[float] = []
    worker = Worker(db, kinds, NullObserver(), ActionRunner({WORK_ACTION: _noop},
                                                            RetryPolicy()), clock,
                    WorkerConfig(worker_id=f"bench-{concurrency}", concurrency=concurrency,
                                 batch_size=concurrency, poll_seconds=0.01))
    real_commit = worker.committer.commit

    async def timed_commit(request: Any) -> int:
        # What a machine waits for its commit: queueing for the batch + the transaction.
        t0 = time.perf_counter()
        try:
            return await real_commit(request)
        finally:
            latencies.append(time.perf_counter() - t0)

    worker.committer.commit = timed_commit  # type: ignore[method-assign]
    started = time.perf_counter()
    task = asyncio.create_task(worker.run())
    try:
        await until_all_terminal(db)
        elapsed = time.perf_counter() - started
    finally:
        worker.stop()
        await task
    latencies.sort()
    return {
        "machines": machines, "transitions": worker.transitions, "seconds": elapsed,
        "write_batches": worker.committer.batches,
        "mean_batch": worker.committer.requests / max(worker.committer.batches, 1),
        "transitions_per_s": worker.transitions / elapsed,
        "commit_p50_ms": 1000 * statistics.median(latencies),
        "commit_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
    }


async def recovery(url: str, db: Database, machines: int, lease_seconds: float) -> dict[str, Any]:
    kinds = default_kinds()
    ids = [new_id() for _ in range(machines)]
    for machine_id in ids:
        await submit(db, kinds, kind="steps", spec={"steps": 6, "payload_bytes": 200},
                     machine_id=machine_id, now=clock.now())
    doomed = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.hanging_worker", "--db", url, "--concurrency",
        str(machines), "--lease-seconds", str(lease_seconds),
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    async with db.reader.connect() as conn:
        while True:  # wait until every machine has its first transition committed and leased
            n = await conn.scalar(text("SELECT count(*) FROM machines WHERE version >= 2 "
                                       "AND lease_owner = 'doomed'"))
            await conn.commit()
            if n == machines:
                break
            await asyncio.sleep(0.05)  # another process: nothing to await
    os.kill(doomed.pid, signal.SIGKILL)
    await doomed.wait()
    async with db.reader.connect() as conn:
        expiry = await conn.scalar(text("SELECT max(lease_expires_at) FROM machines"))
    assert isinstance(expiry, datetime)

    first_claim: dict[str, float] = {}
    real_claim = leases.claim_due

    async def recording_claim(*args: Any, **kwargs: Any) -> Any:
        claimed = await real_claim(*args, **kwargs)
        now = time.time()
        for c in claimed:
            first_claim.setdefault(c.record.id, now)
        return claimed

    loop.leases.claim_due = recording_claim  # type: ignore[attr-defined]
    worker = Worker(db, kinds, NullObserver(), ActionRunner({WORK_ACTION: _noop},
                                                            RetryPolicy()), clock,
                    WorkerConfig(worker_id="rescuer", concurrency=128, batch_size=128,
                                 poll_seconds=0.05, lease_seconds=30))
    task = asyncio.create_task(worker.run())
    try:
        await until_all_terminal(db)
        finished = time.time()
    finally:
        worker.stop()
        await task
        loop.leases.claim_due = real_claim  # type: ignore[attr-defined]
    expiry_ts = expiry.astimezone(UTC).timestamp()
    histories_ok = True
    for machine_id in ids[:50]:  # spot-check: exact histories after the crash
        steps = [e.data.get("step") for e in await queries.history(db, machine_id)][1:]
        histories_ok &= steps == [1, 2, 3, 4, 5, 6]
    return {
        "machines": machines, "lease_seconds": lease_seconds,
        "all_resumed_s_after_expiry": max(first_claim.values()) - expiry_ts,
        "all_finished_s_after_expiry": finished - expiry_ts,
        "resumed": len(first_claim), "histories_exact": histories_ok,
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machines", type=int, default=2000, help="machines at concurrency 32")
    p.add_argument("--machines-serial", type=int, default=200, help="machines at concurrency 1")
    p.add_argument("--recovery", type=int, default=500, help="machines in flight at the kill")
    p.add_argument("--lease-seconds", type=float, default=5.0)
    p.add_argument("--json", type=Path, help="write the figures here "
                                             "(default bench/results/engine_throughput.json)")
    args = p.parse_args()
    configure_logs("console", "warning")
    url = await fresh_database(db_name("engine"))
    db = open_database(url, pool_size=40)
    results: dict[str, Any] = {}
    try:
        await migrate.upgrade(db)
        results["floor_c1_per_s"] = await floor(db, 2000, 1)
        results["floor_c32_per_s"] = await floor(db, 8000, 32)
        results["engine_c1"] = await throughput(db, args.machines_serial, 1)
        results["engine_c32"] = await throughput(db, args.machines, 32)
        results["recovery"] = await recovery(url, db, args.recovery, args.lease_seconds)
    finally:
        await db.dispose()
    c1, c32, rec = results["engine_c1"], results["engine_c32"], results["recovery"]
    print(f"bare INSERT+COMMIT floor     c=1: {results['floor_c1_per_s']:8.0f}/s   "
          f"c=32: {results['floor_c32_per_s']:8.0f}/s")
    for name, r, fl in (("engine c=1 ", c1, results["floor_c1_per_s"]),
                        ("engine c=32", c32, results["floor_c32_per_s"])):
        print(f"{name}: {r['transitions_per_s']:8.0f} transitions/s ({r['transitions']} in "
              f"{r['seconds']:.1f}s, {r['transitions_per_s'] / fl:.2f}x floor), commit p50 "
              f"{r['commit_p50_ms']:.2f} ms p99 {r['commit_p99_ms']:.2f} ms, "
              f"mean group commit {r['mean_batch']:.1f}")
    print(f"recovery of {rec['machines']} in flight after kill -9: all resumed "
          f"{rec['all_resumed_s_after_expiry']:.2f}s after lease expiry, all finished "
          f"{rec['all_finished_s_after_expiry']:.2f}s after; histories exact: "
          f"{rec['histories_exact']}")
    write_results("engine_throughput", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
