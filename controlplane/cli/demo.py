"""``cpctl demo``: the engine end to end on the embedded default, in seconds.

Creates (or reuses) the SQLite file, applies the schema, submits a few ``steps``
machines — one of them gated on a pod UID and woken by key, as a pod watch would —
runs a worker until all are terminal while printing progress, then prints one
machine's history and verifies replay. The Kubernetes simulator and the on-disk OCI
registry join the demo with the cluster and registry issues.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from controlplane.cli import render
from controlplane.cli.commands import build_worker, clock
from controlplane.clock import new_id
from controlplane.machines.registry import default_kinds
from controlplane.operations import submit
from controlplane.replay import rebuild, verify
from controlplane.store import leases, migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.worker.runtime import WorkerConfig


async def demo_cmd(args: argparse.Namespace) -> int:
    started = time.monotonic()
    db = open_database(args.db)
    kinds = default_kinds()
    try:
        before, after = await migrate.upgrade(db)
        print(f"[demo] database {db.display_url}: schema {after} (was {before or 'empty'})")
        ids = []
        for _n in range(args.machines):
            ids.append(await submit(db, kinds, kind="steps", spec={"steps": 6,
                                    "payload_bytes": 200}, machine_id=new_id(), now=clock.now()))
        gated = await submit(db, kinds, kind="steps", machine_id=new_id(), now=clock.now(),
                             spec={"steps": 3, "gate_pod": "demo/gate", "gate_pod_uid": "uid-1"})
        print(f"[demo] submitted {len(ids)} machines of 6 steps, and {gated[:8]} gated on "
              "pod uid-1")
        worker = build_worker(db, WorkerConfig(worker_id="demo-worker", poll_seconds=0.05))
        task = asyncio.create_task(worker.run())
        try:
            await _progress(db, ids, started)
            woke = await leases.wake_by_key(db, key="uid-1", now=clock.now())
            print(f"[demo] pod uid-1 changed: woke {woke} machine (no polling); it now "
                  "waits for its gate pod, then times out by its deadline")
        finally:
            worker.stop()
            await task
        history = await queries.history(db, ids[0])
        print(f"\n[demo] history of {ids[0]}:")
        render.table(["seq", "time", "event", "facts (why)", "by"],
                     [(e.seq, e.recorded_at, e.type, e.facts, e.worker_id) for e in history])
        report = await rebuild(db, kinds, now=clock.now())
        vreport = await verify(db, kinds)
        print(f"\n[demo] replay: {report.machines} machines, {report.events} events, "
              f"{len(report.mismatches)} projection mismatches, "
              f"{len(vreport.mismatches)} nondeterministic decisions")
        print(f"[demo] done in {time.monotonic() - started:.1f}s "
              f"({worker.transitions} transitions)")
        return 0 if report.clean and vreport.clean else 5
    finally:
        await db.dispose()


async def _progress(db: Database, ids: list[str], started: float) -> None:
    while True:
        counts = await queries.count_by_phase(db)
        steps = {phase: n for (kind, phase), n in counts.items() if kind == "steps"}
        line = ", ".join(f"{p}={n}" for p, n in sorted(steps.items()))
        sys.stdout.write(f"\r[demo] {time.monotonic() - started:5.1f}s  {line}   ")
        sys.stdout.flush()
        records = [await queries.get_machine(db, i) for i in ids]
        if all(r.terminal and r.lease_owner is None and r.next_wake_at is None
               for r in records):
            sys.stdout.write("\n")
            return
        await asyncio.sleep(0.1)
