"""A migration asks the registry about its artifact only when a decision needs it.

The worker observes a machine's interests on every wake, and a migration is woken often
while the node agent works (each progress annotation on the source pod is a watch
event). Probing the tag on each of those wakes cost about 9 resolves per migration
(``docs/performance.md``). Only three decisions need the registry: verifying the
artifact once the agent reports it pushed, re-checking it just before the source is
deleted (gate 1), and confirming it gone after garbage collection.
"""

from __future__ import annotations

from pathlib import Path

from bench.cluster import CountingRegistry
from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from tests.agent.engine import open_engine
from tests.agent.world import open_world
from tests.support.waiting import eventually

NS = "default"
MIGRATIONS = 4


async def test_each_migration_resolves_its_artifact_at_most_three_times(
        tmp_path: Path) -> None:
    async with open_world(tmp_path, registry="layout") as w:
        names = [f"app{i}" for i in range(MIGRATIONS)]
        for name in names:
            w.cluster.create_pod(NS, name, node="node-1", marker=f"{name}=1")
        for name in names:
            await w.running(NS, name)
        probes = CountingRegistry(w.backend.registry)
        async with open_engine(w, tmp_path, registry=probes) as db:
            for name in names:
                await submit(db, default_kinds(), kind="migration", machine_id=name,
                             spec=_spec(w, name), now=SystemClock().now())

            async def finished() -> bool:
                return all([(await queries.get_machine(db, n)).terminal for n in names])

            await eventually(finished, limit_seconds=90, what="the migrations to end")
            phases = [(await queries.get_machine(db, n)).phase for n in names]
    assert phases == ["Succeeded"] * MIGRATIONS
    assert probes.counts["resolve"] <= 3 * MIGRATIONS, probes.counts


def _spec(w: object, name: str) -> dict[str, object]:
    from tests.agent.world import World
    assert isinstance(w, World)
    source = w.cluster.pod(NS, name)
    assert source is not None
    return {"pod": {"namespace": NS, "name": name, "uid": source["metadata"]["uid"]},
            "source_node": "node-1", "target_node": "node-2",
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "main",
                                                  "image": "registry.k8s.io/pause:3.9"}]}},
            "class": {"repository": w.repo, "timeouts": {
                "capture": 60, "restore": 60, "schedule": 30, "gc": 60}}}
