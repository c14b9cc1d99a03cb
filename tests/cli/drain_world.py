"""A drain's world: the embedded product (SQLite, simulator, agents, OCI layout) with a
source node full of pods and targets partly filled, plus readers of what happened.

Everything asserted is read back from the store (the drain's events, the children's
rows) or the simulator's objects — never inferred from timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock, new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.planning import DrainPlan, node_info, plan_drain, pod_info, usage
from controlplane.machines.drain.request import drain_spec
from controlplane.machines.submission import Limits
from controlplane.store import migrate, queries
from controlplane.store.database import Database, open_database
from controlplane.store.records import MachineRecord
from controlplane.wiring.embedded import Embedded, embedded
from drivers.sim import MARKER
from tests.support.waiting import eventually

NS = "default"
NODES = ["node-1", "node-2", "node-3", "node-4"]
#: CPU already taken on each target: 1.5 + 1 + 2 = 4.5 cores free for 4 cores of pods.
FILLERS = {"node-2": "2500m", "node-3": "3", "node-4": "2"}
SIZES = ["100m", "150m", "200m", "250m", "300m"]
clock = SystemClock()


@dataclass
class DrainWorld:
    db: Database
    world: Embedded
    names: list[str]

    @property
    def cluster(self) -> Any:
        return self.world.cluster

    def klass(self) -> JsonObject:
        return {"repository": self.world.repository("checkpoints/drain"),
                "timeouts": {"capture": 60, "restore": 60, "schedule": 30, "gc": 60}}

    def plan(self, node: str = "node-1") -> DrainPlan:
        nodes = [node_info(n) for n in self.cluster.store.peek("nodes")]
        pods = [pod_info(p) for p in self.cluster.store.peek("pods")]
        return plan_drain(node, nodes, pods)

    async def submit(self, max_parallel: int) -> str:
        plan = self.plan()
        spec = drain_spec(plan, list(self.cluster.store.peek("pods")), self.klass(),
                          max_parallel)
        outcome = await submit_operation(self.db, default_kinds(),
                                         self.world.submission_observer, kind="drain",
                                         spec=spec, machine_id=new_id(), now=clock.now())
        self.world.worker.nudge()
        return outcome.machine_id

    async def settled(self, machine_id: str, limit: float = 90) -> MachineRecord:
        async def done() -> bool:
            r = await queries.get_machine(self.db, machine_id)
            return r.terminal and r.lease_owner is None and r.next_wake_at is None
        await eventually(done, limit_seconds=limit, every=0.05, what=f"{machine_id} settled")
        return await queries.get_machine(self.db, machine_id)

    async def events(self, machine_id: str, type_: str) -> list[Any]:
        return [e for e in await queries.history(self.db, machine_id) if e.type == type_]

    def running_pods(self) -> dict[str, dict[str, Any]]:
        """Running pods by workload: the ``app`` label survives a move, the name does not
        (a restored pod is named ``<name>-r<hash>-<attempt>``). Two pods of one workload
        fail the test: a move must never leave a copy behind."""
        out: dict[str, dict[str, Any]] = {}
        for p in self.cluster.store.peek("pods"):
            if (p.get("status") or {}).get("phase") != "Running":
                continue
            app = (p["metadata"].get("labels") or {}).get("app") or p["metadata"]["name"]
            assert app not in out, f"{app} runs twice"
            out[app] = p
        return out

    def overfilled(self) -> list[str]:
        """Nodes whose running pods request more than the node can allocate."""
        nodes = {n.name: n for n in (node_info(o) for o in self.cluster.store.peek("nodes"))}
        used = usage([pod_info(p) for p in self.cluster.store.peek("pods")])
        return [name for name, u in used.items()
                if u.cpu > nodes[name].allocatable.cpu + 1e-9
                or u.memory > nodes[name].allocatable.memory]

    def node_unschedulable(self, name: str) -> bool:
        return bool((self.cluster.store.get("nodes", "", name).get("spec") or {})
                    .get("unschedulable"))

    def marker_of(self, name: str) -> str | None:
        pod = self.running_pods().get(name)
        return None if pod is None else (pod["metadata"].get("annotations") or {}).get(MARKER)


def max_in_flight(history: list[Any]) -> int:
    """Fold the drain's own events: +1 per child started, -1 per child settled."""
    live = peak = 0
    for e in history:
        if e.type == "ChildStarted":
            live += 1
            peak = max(peak, live)
        elif e.type == "ChildFinished":
            live -= 1
    return peak


def max_overlap(intervals: list[tuple[Any, Any]]) -> int:
    """Most intervals open at once (closing before opening at equal times)."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda p: (p[0], p[1]))
    live = peak = 0
    for _, step in points:
        live += step
        peak = max(peak, live)
    return peak


@contextlib.asynccontextmanager
async def drain_world(tmp_path: Path, *, pods: int, max_per_node: int = 4,
                      db_url: str | None = None) -> AsyncIterator[DrainWorld]:
    """``db_url``: an empty database (the ``db_url`` fixture: SQLite and PostgreSQL)."""
    db = open_database(db_url or f"sqlite:///{tmp_path / 'cp.db'}", pool_size=40)
    try:
        await migrate.upgrade(db)
        limits = Limits(max_cluster=10, max_per_source_node=max_per_node)
        async with embedded(db, tmp_path, clock, nodes=NODES, limits=limits) as world:
            cluster = world.cluster
            for node, cpu in FILLERS.items():
                cluster.create_pod(NS, f"filler-{node}", node=node, cpu=cpu, memory="256Mi")
            names = [f"app-{i:02d}" for i in range(pods)]
            for i, name in enumerate(names):
                cluster.create_pod(NS, name, node="node-1", cpu=SIZES[i % len(SIZES)],
                                   memory="64Mi", marker=f"{name}=v{i}",
                                   labels={"app": name, "tier": "web" if i % 2 else "db"})
            await cluster.wait_for(lambda: len([
                p for p in cluster.store.peek("pods")
                if (p.get("status") or {}).get("phase") == "Running"]) == pods + len(FILLERS),
                what="every pod running", limit_seconds=30)
            yield DrainWorld(db, world, names)
    finally:
        await db.dispose()
