"""A worker process of this release meets machines a newer release wrote: it leaves them.

The next rolling upgrade runs this release as the *old* one. What a newer release may
write that this one cannot read is simulated in the database: a machine of a kind this
release does not run, and one whose outbox holds an action type it has no handler for.
A real ``cpctl worker`` (this tree, the simulated cluster) must, for each: decide nothing
(version 1, history ``Submitted`` only, outbox kept), hand it back due, not crash or
exit, say so once in its log (``machine left to a newer worker``, with the reason) and
in its ``/metrics`` (``controlplane_worker_machines_left_total{reason}`` and the gauge),
and meanwhile drive the machines it can read to their end.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import update

from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import event_store, migrate, queries, schema
from controlplane.store.database import open_database
from controlplane.store.records import Projection
from drivers.sim import SimCluster
from tests.support.waiting import eventually
from tests.upgrade.previous_release import ROOT

pytestmark = pytest.mark.slow

LEFT = "machine left to a newer worker"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text: str = answer.read().decode()
        return text


def _start_worker(url: str, port: int, kubeconfig: Path, layout: Path,
                  log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "--db", url, "--log-format", "json",
             "worker", "--worker-id", "w-0.2.0", "--poll-seconds", "0.05", "--no-front-door",
             "--metrics-listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig),
             "--registry-layout", str(layout)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)


async def test_a_worker_leaves_what_a_newer_release_wrote_and_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    db = open_database(url)
    clock = SystemClock()
    try:
        await migrate.upgrade(db)
        await event_store.create_machine(
            db, machine_id="future-kind", kind="hibernation", spec={"pod": "default/a"},
            initial=Projection("Hibernating", {"phase": "Hibernating"}, False, None),
            now=clock.now(), worker_id="release-0.3.0")
        await submit(db, default_kinds(), kind="steps", spec={"steps": 1},
                     machine_id="future-action", now=clock.now())
        future = {"type": "HibernatePod", "key": "future-action:hibernate", "params": {}}
        async with db.writer.begin() as conn:
            await conn.execute(update(schema.machines)
                               .where(schema.machines.c.id == "future-action")
                               .values(pending_actions=[future]))
        await submit(db, default_kinds(), kind="steps", spec={"steps": 2},
                     machine_id="readable", now=clock.now())

        port = _free_port()
        log = tmp_path / "worker.log"
        async with SimCluster(nodes=1, seed=0) as cluster:
            kubeconfig = cluster.write_kubeconfig(tmp_path / "sim.kubeconfig")
            worker = _start_worker(url, port, kubeconfig, tmp_path / "oci", log)
            try:
                async def both_left() -> bool:
                    assert worker.poll() is None, log.read_text()[-3000:]
                    readable = await queries.get_machine(db, "readable")
                    try:
                        text = await asyncio.to_thread(_metrics, port)
                    except OSError:
                        return False  # not serving yet
                    return readable.terminal and \
                        'controlplane_worker_machines_left{worker="w-0.2.0"} 2' in text
                await eventually(both_left, limit_seconds=60, every=0.1,
                                 what="the readable machine ended and two machines left")
                text = await asyncio.to_thread(_metrics, port)
                for reason in ("unknown_kind", "unknown_action"):
                    assert (f'controlplane_worker_machines_left_total{{reason="{reason}",'
                            f'worker="w-0.2.0"}} 1') in text, text
                assert 'controlplane_worker_step_crashes_total{worker="w-0.2.0"} 0' in text
            finally:
                worker.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(worker.wait, 60)
            assert code == 0, log.read_text()[-3000:]

        for machine_id in ("future-kind", "future-action"):
            record = await queries.get_machine(db, machine_id)
            assert record.version == 1
            assert [e.type for e in await queries.history(db, machine_id)] == ["Submitted"]
            assert record.lease_owner is None
            assert record.next_wake_at is not None  # due: for a worker that reads it
        kept = await queries.get_machine(db, "future-action")
        assert kept.pending_actions == [future]
        left = [json.loads(line) for line in log.read_text().splitlines() if LEFT in line]
        assert sorted((e["machine_id"], e["reason"]) for e in left) == [
            ("future-action", "unknown_action"), ("future-kind", "unknown_kind")]
    finally:
        await db.dispose()
