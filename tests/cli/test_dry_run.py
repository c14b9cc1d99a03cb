"""``--dry-run`` on migrate, suspend, restore and drain prints the plan and changes nothing:
no event or row in the database, no write to the API server (the simulator counts every
request by verb), no write to the registry (the OCI layout's files are unchanged).

``cpctl`` runs through its real entry point (``main``) in a thread, against the embedded
product running in the test's event loop, so the simulator's request counter is readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controlplane.app.operations import submit_operation
from controlplane.cli.main import main
from controlplane.clock import new_id
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate
from controlplane.store.database import open_database
from drivers.sim import SimCluster
from tests.cli.drain_world import DrainWorld, clock, drain_world

pytestmark = pytest.mark.slow
WRITES = ("create", "update", "patch", "delete", "deletecollection")


Output = pytest.CaptureFixture[str]


async def cpctl(capfd: Output, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Run ``cpctl`` (its ``main``) in a thread; return (exit code, stdout, stderr)."""
    capfd.readouterr()

    def run() -> int:
        return main(["--db", f"sqlite:///{tmp_path / 'cp.db'}", "--log-level", "error",
                     *args, "--kubeconfig", str(tmp_path / "sim-kubeconfig.yaml"),
                     "--registry-layout", str(tmp_path / "registry")])
    code = await asyncio.to_thread(run)
    out, err = capfd.readouterr()
    return code, out, err


def document(stdout: str) -> Any:
    """The JSON document in stdout (log lines from the test's own loop may surround it)."""
    lines = stdout.splitlines()
    start, end = lines.index("{"), len(lines) - lines[::-1].index("}")
    return json.loads("\n".join(lines[start:end]))


def rows(tmp_path: Path) -> tuple[int, int, int]:
    with contextlib.closing(sqlite3.connect(tmp_path / "cp.db")) as conn:
        counts = [int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
                  for table in ("machines", "events", "decisions")]
    return counts[0], counts[1], counts[2]


def registry_files(tmp_path: Path) -> dict[str, int]:
    root = tmp_path / "registry"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def writes(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {verb: after[verb] - before[verb] for verb in WRITES if after[verb] - before[verb]}


async def checkpoint(w: DrainWorld, name: str) -> str:
    uid = w.cluster.pod("default", name)["metadata"]["uid"]
    outcome = await submit_operation(
        w.db, default_kinds(), w.world.submission_observer, kind="checkpoint",
        spec={"pod": {"namespace": "default", "name": name, "uid": uid}, "class": w.klass()},
        machine_id=new_id(), now=clock.now())
    w.world.worker.nudge()
    record = await w.settled(outcome.machine_id)
    assert record.phase == "Succeeded"
    return outcome.machine_id


async def test_dry_runs_print_the_plan_and_write_nothing(tmp_path: Path,
                                                        capfd: Output) -> None:
    async with drain_world(tmp_path, pods=4) as w:
        checkpoint_id = await checkpoint(w, "app-00")
        repo = w.world.repository("checkpoints/drain")
        before = (rows(tmp_path), registry_files(tmp_path), Counter(w.cluster.requests))

        code, out, err = await cpctl(capfd, tmp_path, "migrate", "default/app-01", "--to", "node-2",
                                     "--repository", repo, "--dry-run", "-o", "json")
        assert code == 0, err
        plan = document(out)
        assert (plan["source_node"], plan["target_node"]) == ("node-1", "node-2")
        assert plan["artifacts_written"] == [f"{repo}:default.app-01.OPERATION-ID"]
        assert plan["refused"] is None
        assert plan["admission"] == "would start now"
        code, out, err = await cpctl(capfd, tmp_path, "migrate", "default/app-01", "--to",
                                     "node-2", "--repository", "x/y", "--dry-run")
        assert code == 2, (out, err)  # bad input named, not "internal error" (exit 70)
        assert "refused: invalid migration request: class.repository 'x/y' must start with " \
            "a registry host" in out, out
        # What the migration itself would do first: ask the node agent for the capture.
        assert plan["would"][0].startswith("record a Normal event MigrationStarted: moving "
                                           "from node-1 to node-2")
        assert plan["would"][1].startswith("annotate pod default/app-01 (uid ")
        assert plan["records"] == ["Started", "CaptureRequested"]
        assert plan["restore_path"] == ("agent on node-2 (sim://1): the node agent captures "
                                        "and restores")

        code, out, err = await cpctl(capfd, tmp_path, "suspend", "default/app-02", "--repository",
                                     repo, "--dry-run", "-o", "json")
        assert code == 0, err
        assert document(out)["artifacts_written"] == [f"{repo}:default.app-02.OPERATION-ID"]

        code, out, err = await cpctl(capfd, tmp_path, "restore", checkpoint_id, "--node", "node-3",
                                     "--dry-run", "-o", "json")
        assert code == 0, err
        plan = document(out)
        assert plan["target_node"] == "node-3"
        assert plan["restore_path"].startswith("agent on node-3 (sim://1)")
        assert plan["artifacts_read"][0].startswith(f"{repo}@sha256:")

        code, out, err = await cpctl(capfd, tmp_path, "drain", "node-1", "--repository", repo,
                                     "--max-parallel", "2", "--dry-run", "-o", "json")
        assert code == 0, err
        plan = document(out)
        assert sorted(m["pod"] for m in plan["moves"]) == [f"default/app-0{i}"
                                                           for i in range(4)]
        assert {m["target"] for m in plan["moves"]} <= {"node-2", "node-3", "node-4"}
        assert len(plan["artifacts_written"]) == 4
        assert (plan["refused"], plan["left"]) == (None, [])
        assert plan["would"] == ["cordon node node-1"]  # the drain's own first action
        # The node it empties is not a target, and a drain names no pod.
        assert (plan["node"], "target_node" in plan, "pod" in plan) == ("node-1", False, False)
        assert (plan["effective_parallel"], plan["capped_by"], plan["warnings"]) == (2, None, [])

        # The defaults: --max-parallel 4 under --max-per-node 2. Said in the plan, with the
        # flag that caps it, and not warned about: the user gave neither value.
        code, out, err = await cpctl(capfd, tmp_path, "drain", "node-1", "--repository", repo,
                                     "--dry-run")
        assert code == 0, err
        assert "DRY RUN: nothing is changed" in out
        assert "default/app-03" in out
        assert "at most 2 at a time (--max-per-node 2 caps --max-parallel 4)" in out
        assert "warning" not in out + err

        # A value the user gave, capped: warned, once, in the plan (with -o json, on
        # stderr: stdout stays one document).
        code, out, err = await cpctl(capfd, tmp_path, "drain", "node-1", "--repository", repo,
                                     "--max-parallel", "4", "--dry-run")
        assert code == 0, err
        assert "  warning: --max-parallel 4 is capped by --max-per-node 2: at most 2" in out
        assert "warning" not in err  # said once, in the plan

        code, out, err = await cpctl(capfd, tmp_path, "drain", "node-1", "--repository", repo,
                                     "--max-parallel", "5", "--max-per-node", "8",
                                     "--max-operations", "3", "--dry-run", "-o", "json")
        assert code == 0, err
        plan = document(out)
        assert (plan["effective_parallel"], plan["capped_by"]) == (3, "--max-operations 3")
        assert "cpctl: warning: --max-parallel 5 is capped by --max-operations 3" in err
        assert plan["warnings"] == [
            "--max-parallel 5 is capped by --max-operations 3: at most 3 children run at "
            "once; raise --max-operations here and on the workers (they admit the children) "
            "to run more"]

        code, out, err = await cpctl(capfd, tmp_path, "migrate", "default/app-01", "--to", "node-1",
                                     "--repository", repo, "--dry-run", "-o", "json")
        assert code == 2
        assert "equals spec.source_node" in document(out)["refused"]

        after = (rows(tmp_path), registry_files(tmp_path), Counter(w.cluster.requests))
        assert after[0] == before[0]  # no machine, event or decision
        assert after[1] == before[1]  # no registry write
        assert writes(before[2], after[2]) == {}  # no API write
        assert after[2]["get"] + after[2]["list"] > before[2]["get"] + before[2]["list"]
        assert not w.node_unschedulable("node-1")


async def test_draining_the_only_node_is_refused(tmp_path: Path, capfd: Output) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    async with SimCluster(nodes=1) as cluster:
        cluster.write_kubeconfig(tmp_path / "sim-kubeconfig.yaml")
        code, _out, err = await cpctl(capfd, tmp_path, "drain", "node-1", "--repository",
                                      "localhost:5000/x")
        assert code == 2
        assert "'node-1' is the only node: there is nowhere to move its pods" in err
        assert writes(Counter(), Counter(cluster.requests)) == {}
    assert rows(tmp_path) == (0, 0, 0)
