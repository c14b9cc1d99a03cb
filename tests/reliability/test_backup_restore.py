"""A backup taken mid-run, restored into a fresh PostgreSQL after the disk is lost.

The procedure of docs/install.md ("Backup and restore"), against the product as deployed:
``cpctl worker`` processes on PostgreSQL, the simulated cluster, a node agent per node and
the registry. The backup (``pg_dump -Fc``) is taken while a migration is recorded and not
yet started; then the cluster goes on: that migration finishes, another migration and a
checkpoint run that the backup never sees. The database is lost (its workers killed with
SIGKILL, the database dropped), the dump is restored into a fresh PostgreSQL server, and
new workers start on it. What the test holds the product to:

- the migration the backup remembers as not started finds its workload where it went
  (``FoundRestored``) instead of failing, and touches nothing;
- every workload runs exactly once (none lost, none duplicated);
- the checkpoint made after the backup is found in the registry by its provenance
  (``cpctl checkpoints --unrecorded``), and collected with ``--collect``;
- ``cpctl replay --verify`` is clean on the restored history.

What a restore cannot bring back (the histories of operations after the backup) is
stated in docs/install.md.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock, new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.catalog import default_kinds
from controlplane.machines.submission import Limits
from controlplane.store import migrate, queries
from controlplane.store.database import Database, open_database
from drivers.sim import MARKER
from tests.reliability.campaign import (
    NS,
    CampaignConfig,
    Fleet,
    World,
    campaign_database,
    open_world,
)
from tests.reliability.throwaway_pg import throwaway_postgres

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(max_cluster=10, max_per_source_node=10)


def _pg(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"PostgreSQL's {name} is not installed (/usr/lib/postgresql/*/bin)"
    return found[-1]


async def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """A command run off the event loop (the simulator and the agents serve from it)."""
    return await asyncio.to_thread(subprocess.run, argv, cwd=ROOT, capture_output=True,
                                   text=True, timeout=120, stdin=subprocess.DEVNULL)


async def cpctl(db_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return await run(sys.executable, "-m", "controlplane.cli.main", "--db", db_url, *argv)


async def ok(*argv: str) -> None:
    done = await run(*argv)
    assert done.returncode == 0, f"{argv[0]}: {done.stderr}"


async def submit(db: Database, world: World, kind: str, pod: str,
                 target: str | None = None) -> str:
    found = world.cluster.pod(NS, pod)
    assert found is not None
    spec: JsonObject = {"pod": {"namespace": NS, "name": pod, "uid": found["metadata"]["uid"]},
                        "class": {"repository": world.repository,
                                  "timeouts": {"capture": 60, "restore": 60, "schedule": 60,
                                               "gc": 30}}}
    if kind == "migration":
        assert target is not None
        spec.update({"source_node": found["spec"]["nodeName"], "target_node": target,
                     "template": {"metadata": {"labels": {"workload": pod}},
                                  "spec": {"containers": found["spec"]["containers"]}}})
    outcome = await submit_operation(db, default_kinds(), world.fresh, kind=kind, spec=spec,
                                     machine_id=new_id(), now=SystemClock().now(),
                                     limits=LIMITS)
    return outcome.machine_id


async def finished(db_url: str, machine_id: str, limit: float = 90.0) -> tuple[str, JsonObject]:
    """The machine's terminal phase and its last event's data, once it has one."""
    db = open_database(db_url, pool_size=1)
    try:
        async with asyncio.timeout(limit):
            while True:
                record = await queries.get_machine(db, machine_id)
                if record.terminal and record.lease_owner is None and not record.pending_actions:
                    events = await queries.history(db, machine_id)
                    return record.phase, dict(events[-1].data)
                await asyncio.sleep(0.1)  # other processes decide: poll the database
    finally:
        await db.dispose()


def carriers(world: World) -> dict[str, list[str]]:
    """marker -> the nodes of the live pods carrying it."""
    out: dict[str, list[str]] = {}
    for p in world.cluster.store.peek("pods"):
        marker = (p["metadata"].get("annotations") or {}).get(MARKER)
        if marker and not p["metadata"].get("deletionTimestamp") and \
                (p.get("status") or {}).get("phase") == "Running":
            out.setdefault(marker, []).append(p["spec"].get("nodeName", ""))
    return out


def pause(fleet: Fleet, sig: signal.Signals) -> None:
    for proc in fleet.procs.values():
        os.kill(proc.pid, sig)


@pytest.mark.timeout(300)
async def test_a_backup_restored_into_a_fresh_server_reconciles_with_the_cluster(
        tmp_path: Path) -> None:
    cfg = CampaignConfig(workers=2, kills=False, nodes=3, workloads=4)
    dump = tmp_path / "history.dump"
    async with campaign_database(cfg.pg_admin_url) as first_url, \
            open_world(cfg, tmp_path, []) as world:
        db = open_database(first_url, pool_size=2)
        try:
            await migrate.upgrade(db)
            for i in range(4):
                world.cluster.create_pod(NS, f"w{i}", node="node-1", marker=f"w{i}=backup")
            await world.cluster.wait_for(lambda: len(carriers(world)) == 4, limit_seconds=60,
                                         what="the workloads running")
            fleet = Fleet(first_url, tmp_path / "before", world.worker_args, 3.0)
            (tmp_path / "before").mkdir()
            for slot in range(2):
                fleet.start(slot)
            try:
                before = await submit(db, world, "migration", "w0", "node-2")
                assert (await finished(first_url, before))[0] == "Succeeded"
                # The backup: taken while a migration is recorded and not yet started.
                pause(fleet, signal.SIGSTOP)
                try:
                    behind = await submit(db, world, "migration", "w1", "node-2")
                    await ok(_pg("pg_dump"), "-Fc", "-f", str(dump), first_url)
                finally:
                    pause(fleet, signal.SIGCONT)
                assert (await finished(first_url, behind))[0] == "Succeeded"
                # After the backup: a migration and a checkpoint the backup never sees.
                after = await submit(db, world, "migration", "w2", "node-3")
                assert (await finished(first_url, after))[0] == "Succeeded"
                unseen = await submit(db, world, "checkpoint", "w3")
                assert (await finished(first_url, unseen))[0] == "Succeeded"
            finally:
                for slot in range(2):  # the disk is lost: the workers die with it
                    fleet.kill(slot)
        finally:
            await db.dispose()
        moved = carriers(world)

        with throwaway_postgres() as fresh:
            restored_url = f"postgresql://postgres@127.0.0.1:{fresh.port}/controlplane"
            await ok(_pg("createdb"), "-h", "127.0.0.1", "-p", str(fresh.port), "-U",
                     "postgres", "controlplane")
            await ok(_pg("pg_restore"), "--no-owner", "-d", restored_url, str(dump))
            upgraded = await cpctl(restored_url, "db", "upgrade")
            assert upgraded.returncode == 0, upgraded.stderr
            fleet = Fleet(restored_url, tmp_path / "after", world.worker_args, 3.0)
            (tmp_path / "after").mkdir()
            for slot in range(2):
                fleet.start(slot)
            try:
                phase, last = await finished(restored_url, behind)
            finally:
                fleet.stop()
            assert (phase, last["reason"], last["final_node"]) == \
                ("Succeeded", "FoundRestored", "node-2"), last
            # Nothing moved again: the workloads run where they were, once each.
            assert carriers(world) == moved
            assert moved == {"w0=backup": ["node-2"], "w1=backup": ["node-2"],
                             "w2=backup": ["node-3"], "w3=backup": ["node-1"]}

            registry = ["--registry-layout", str(tmp_path / "oci")]
            listed = await cpctl(restored_url, "checkpoints", "--unrecorded", *registry,
                           "--repository", world.repository, "-o", "json")
            assert listed.returncode == 0, listed.stderr
            items = json.loads(listed.stdout)["items"]
            assert [(i["checkpoint_id"], i["workload"]) for i in items] == \
                [(unseen, f"{NS}/w3")]
            collected = await cpctl(restored_url, "checkpoints", "--unrecorded", *registry,
                              "--repository", world.repository, "--collect")
            assert collected.returncode == 0, collected.stderr
            assert "1 unrecorded checkpoint(s) deleted" in collected.stderr
            again = await cpctl(restored_url, "checkpoints", "--unrecorded", *registry,
                          "--repository", world.repository)
            assert "is recorded in the history" in again.stdout, again.stdout + again.stderr

            replay = await cpctl(restored_url, "replay", "--verify")
            assert replay.returncode == 0, replay.stdout + replay.stderr
            history = await cpctl(restored_url, "history", behind)
            assert "FoundRestored" in history.stdout, history.stdout
