"""Record ``todays_rows.sqlite``: a database written end to end by the product as it was
before events were typed, for the typed code to read back.

``python -m tests.golden.todays_rows`` runs the embedded product (SQLite, simulated
cluster, a node agent per node, OCI layout on disk) through every product kind — the
demo's checkpoint, migration, suspend and resume, then a restore of the checkpoint, a
migration cancelled while it waits, and a drain with its children — and writes the
database (vacuumed) next to this file. It was recorded once, at commit ``2c9ddba``
(before the capture, source, restore and collection steps and the checkpoint, restore,
migration, suspend and resume kinds were typed); ``test_todays_rows.py`` proves that
today's deciders fold and re-decide every row of it exactly. Do not re-record it after a
change to the events: its point is that it was written by the old code.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from controlplane.app.operations import send_command
from controlplane.cli.demo import NS, Demo
from controlplane.clock import SystemClock
from controlplane.machines.base.commands import Cancel
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.planning import node_info, plan_drain, pod_info
from controlplane.machines.drain.request import drain_spec
from controlplane.store import migrate, queries
from controlplane.store.database import open_database
from controlplane.wiring.embedded import embedded

HERE = Path(__file__).parent
ROWS = HERE / "todays_rows.sqlite"
clock = SystemClock()


async def record(root: Path) -> Path:
    path = root / "controlplane.db"
    db = open_database(f"sqlite:///{path}")
    try:
        await migrate.upgrade(db)
        async with embedded(db, root / "world", clock) as world:
            demo = Demo(db, world, time.monotonic())
            await demo.run()
            await _restore_cancel_and_drain(demo)
    finally:
        await db.dispose()
    return path


async def _restore_cancel_and_drain(demo: Demo) -> None:
    cluster = demo.world.cluster
    [ckpt] = [r for r in await queries.list_machines(demo.db, queries.MachineFilter())
              if r.kind == "checkpoint"]
    history = await queries.history(demo.db, ckpt.id)
    verified = next(e for e in history if e.type == "ArtifactVerified")
    requested = next(e for e in history if e.type == "CaptureRequested")
    pod = ckpt.spec["pod"]
    assert isinstance(pod, dict)
    restore = await demo.submit("restore", {
        "artifact": verified.data["pinned"], "namespace": NS, "name": "web-copy",
        "node": "node-2", "template": demo._template("web"),
        "checkpoint_id": requested.data["checkpoint_id"], "source_uid": pod["uid"],
        "class": demo.klass})
    record = await demo.follow(restore, "restore web as web-copy on node-2")
    demo.expect(record.phase == "Succeeded", f"restore ended {record.phase}")

    # A migration cancelled by the operator: its history holds a command decision.
    cluster.create_pod(NS, "idle", node="node-2", marker="n=1")
    await cluster.wait_for(lambda: demo._phase("idle") == "Running", what="idle running")
    mig = await demo.submit("migration", {
        "pod": demo._ref("idle"), "source_node": "node-2", "target_node": "node-3",
        "template": demo._template("idle"), "class": demo.klass})
    await send_command(demo.db, default_kinds(), machine_id=mig, command=Cancel(),
                       now=clock.now())
    demo.world.worker.nudge()
    record = await demo.follow(mig, "cancelled migration of idle")
    demo.expect(record.terminal, f"the cancelled migration ended {record.phase}")

    # A drain of node-3 (the resumed sandbox runs there): one child migration.
    nodes = [node_info(n) for n in cluster.store.peek("nodes")]
    pods = [pod_info(p) for p in cluster.store.peek("pods")]
    plan = plan_drain("node-3", nodes, pods)
    spec = drain_spec(plan, list(cluster.store.peek("pods")), demo.klass, 2)
    drain = await demo.submit("drain", spec)
    record = await demo.follow(drain, "drain node-3")
    demo.expect(record.phase == "Succeeded", f"drain ended {record.phase}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = asyncio.run(record(Path(tmp)))
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn = sqlite3.connect(path)
        conn.execute("VACUUM")
        conn.close()
        shutil.copyfile(path, ROWS)
    print(f"wrote {ROWS} ({ROWS.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
