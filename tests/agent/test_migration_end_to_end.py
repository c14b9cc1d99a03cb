"""A real migration end to end: the engine's machines, the drivers and the node agents.

SQLite event store + worker + the migration machine, deciding on what the Kubernetes
driver (simulated cluster) and the registry driver observe, acting through their
handlers; the node agents do the capture and the restore. Pins that the three speak one
protocol: the workload's state (the simulator's marker) arrives on the target node, the
source is gone, the artifact is garbage-collected only after the restore was verified
— and when the registry refuses the delete, the migration ends in
``GarbageCollectionFailed``, not a clean success (gate 7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.machines.contract import protocol
from controlplane.store import queries
from controlplane.worker.actions import RetryPolicy
from drivers.sim import MARKER
from tests.agent.engine import open_engine
from tests.agent.world import World, open_world
from tests.support.waiting import eventually

NS = "default"
RETRIES = RetryPolicy(attempts=2, timeout_seconds=10, backoff_base_seconds=0.01,
                      backoff_max_seconds=0.05)


def migration_spec(w: World, *, gc_seconds: int = 86400) -> dict[str, object]:
    source = w.cluster.pod(NS, "app")
    assert source is not None
    return {"pod": {"namespace": NS, "name": "app", "uid": source["metadata"]["uid"]},
            "source_node": "node-1", "target_node": "node-2",
            "template": {"metadata": {"labels": {"app": "demo"}},
                         "spec": {"containers": [{"name": "main",
                                                  "image": "registry.k8s.io/pause:3.9"}]}},
            "class": {"repository": w.repo, "timeouts": {
                "capture": 60, "restore": 60, "schedule": 30, "gc": gc_seconds}}}


async def run_migration(w: World, tmp_path: Path, *,
                        gc_seconds: int = 86400) -> tuple[str, list[str]]:
    w.cluster.create_pod(NS, "app", node="node-1", marker="counter=41")
    await w.running(NS, "app")
    spec = migration_spec(w, gc_seconds=gc_seconds)
    async with open_engine(w, tmp_path) as db:
        await submit(db, default_kinds(), kind="migration", spec=spec,  # type: ignore[arg-type]
                     machine_id="mig-1", now=SystemClock().now())

        async def finished() -> bool:
            return (await queries.get_machine(db, "mig-1")).terminal

        await eventually(finished, limit_seconds=60, what="the migration to finish")
        record = await queries.get_machine(db, "mig-1")
        return record.phase, [e.type for e in await queries.history(db, "mig-1")]


def restored_pods(w: World) -> list[dict[str, Any]]:
    return [p for p in w.cluster.store.peek("pods") if p["metadata"]["name"] != "app"]


async def test_migration_moves_the_workload_state_and_collects_the_artifact(
        tmp_path: Path) -> None:
    async with open_world(tmp_path, registry="layout") as w:
        phase, events = await run_migration(w, tmp_path)
        assert phase == "Succeeded", events
        assert w.cluster.pod(NS, "app") is None
        [pod] = restored_pods(w)
        notes = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == "node-2"
        assert notes[MARKER] == "counter=41"
        digest = notes[protocol.RESTORED_FROM_DIGEST]
        assert notes[protocol.INSTANCE_ID].startswith(pod["metadata"]["uid"])
        assert events.index("ArtifactVerified") < events.index("SourceDeleted")
        assert events.index("RestoreVerified") < events.index("ArtifactDeleted")
        assert await w.backend.registry.resolve(w.repo, digest) is None


@pytest.mark.parametrize("registry", ["layout", "distribution"])
async def test_refused_artifact_delete_ends_in_gc_failed_not_success(
        tmp_path: Path, registry: str) -> None:
    async with open_world(tmp_path, registry=registry, allow_delete=False) as w:
        phase, events = await run_migration(w, tmp_path, gc_seconds=2)
        assert phase == "GarbageCollectionFailed", events
        assert "ArtifactDeletionFailed" in events
        [pod] = restored_pods(w)
        notes = pod["metadata"]["annotations"]
        assert notes[MARKER] == "counter=41"  # the workload made it; only the GC did not
        kept = await w.backend.registry.resolve(w.repo, notes[protocol.RESTORED_FROM_DIGEST])
        assert kept is not None
