"""``cpctl demo``: the product end to end on the embedded default, in under a minute.

SQLite file + simulated 3-node cluster + node agents + OCI layout on disk, all in this
process (``wiring.embedded``). It checkpoints a pod, migrates a pod carrying a workload
marker and proves the marker arrived on the target node, suspends a third pod and
resumes it from its checkpoint (marker again), showing each operation's progress; then
prints the migration's history, a report of every operation, and replays the whole
event log to prove projections and decisions reproduce. Exits non-zero if any of that
does not hold. Its data lives under ``--workdir`` (default ``var/demo``, recreated).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from controlplane.app.checkpoints import checkpoint_of
from controlplane.app.operations import submit_operation
from controlplane.app.replay import phase_after_each, rebuild, verify
from controlplane.app.requester import os_identity
from controlplane.cli import render
from controlplane.cli.context import clock
from controlplane.cli.progress import follow
from controlplane.cli.why import facts_text
from controlplane.clock import new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import ControlPlaneError
from controlplane.machines.catalog import default_kinds
from controlplane.machines.contract import protocol
from controlplane.store import migrate, queries, reports
from controlplane.store.database import Database, open_database
from controlplane.store.records import MachineRecord

NS = "default"
MARKER = "sim.controlplane.dev/marker"  # the simulator's workload state (docs/simulator.md)


class DemoFailed(ControlPlaneError):
    """Something the demo promises did not hold."""


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


async def demo_cmd(args: argparse.Namespace) -> int:
    from controlplane.wiring.embedded import embedded  # loads the drivers only for the demo

    started = time.monotonic()
    root = Path(args.workdir)
    _fresh_directory(root)
    db = open_database(f"sqlite:///{root / 'controlplane.db'}")
    try:
        await migrate.upgrade(db)
        say(f"embedded default: SQLite {root / 'controlplane.db'}, simulated cluster "
            f"(3 nodes), OCI layout {root / 'registry'}, a node agent per node; checkpoints "
            f"sealed (encrypted and signed) with the keys in {root / 'keys'}")
        async with embedded(db, root, clock) as world:
            demo = Demo(db, world, started, root / "controlplane.db")
            await demo.run()
        ok = await _replay(db)
    finally:
        await db.dispose()
    say(f"done in {time.monotonic() - started:.1f}s")
    return 0 if ok else 5


class Demo:
    """The demo's steps, over a running embedded world."""

    def __init__(self, db: Database, world: Any, started: float,
                 db_path: Path | None = None) -> None:
        self.db, self.world, self.started = db, world, started
        self.db_path = db_path  # as the user names it (relative to where they ran it)
        self.repo = world.repository("checkpoints/demo")
        self.klass: JsonObject = {"repository": self.repo, "timeouts": {
            "capture": 60, "restore": 60, "schedule": 30, "gc": 60},
            "encryption": world.encryption()}

    async def run(self) -> None:
        cluster = self.world.cluster
        for name, node, marker in (("web", "node-1", "visits=3"), ("app", "node-1",
                                   "counter=41"), ("sandbox", "node-3", "session=7")):
            cluster.create_pod(NS, name, node=node, marker=marker)
        for name in ("web", "app", "sandbox"):
            await cluster.wait_for(lambda n=name: self._phase(n) == "Running",
                                   what=f"{NS}/{name} running")
        say("pods web, app (node-1) and sandbox (node-3) are Running, each with a marker")

        ckpt = await self.submit("checkpoint", {"pod": self._ref("web"), "class": self.klass})
        record = await self.follow(ckpt, "checkpoint web")
        self.expect(record.phase == "Succeeded", f"checkpoint ended {record.phase}")

        mig, moved = await self.migrate_app()
        marker = moved["metadata"]["annotations"].get(MARKER)
        self.expect(marker == "counter=41", f"marker after migration: {marker!r}")
        say(f"app now runs on node-2 as {moved['metadata']['name']}; marker {marker!r} "
            "survived; source deleted, artifact collected")

        template = self._template("sandbox")
        sus = await self.submit("suspend", {"pod": self._ref("sandbox"),
                                            "template": template, "class": self.klass})
        record = await self.follow(sus, "suspend sandbox")
        self.expect(record.phase == "Suspended", f"suspend ended {record.phase}")
        self.expect(self.world.cluster.pod(NS, "sandbox") is None, "sandbox still exists")
        res = await self.submit("resume", {
            "namespace": NS, "name": "sandbox", "node": "node-3", "template": template,
            "candidates": [await self._candidate(sus)], "class": self.klass})
        record = await self.follow(res, "resume sandbox")
        self.expect(record.phase == "Resumed", f"resume ended {record.phase}")
        marker = self._restored("sandbox")["metadata"]["annotations"].get(MARKER)
        self.expect(marker == "session=7", f"marker after resume: {marker!r}")
        say(f"sandbox resumed from its checkpoint; marker {marker!r} survived")

        await self.report(mig, checkpoints=3)

    async def report(self, mig: str, *, checkpoints: int) -> None:
        """The migration's history, every operation, the checkpoints, the phases."""
        say(f"history of the migration {mig}:")
        record = await queries.get_machine(self.db, mig)
        events = await queries.history(self.db, mig)
        phases = phase_after_each(default_kinds(), record, events)
        shown, timeline = "", []
        for e, phase in zip(events, phases, strict=True):
            timeline.append((e.seq, e.recorded_at, f"-> {phase}" if phase != shown else "",
                             e.type, facts_text(e.facts)))
            shown = phase
        render.table(["seq", "time", "phase", "event", "why (observed facts)"], timeline,
                     fill=4, width=shutil.get_terminal_size((160, 24)).columns)
        say("report: every operation")
        rows = []
        for r in reversed(await queries.list_machines(self.db, queries.MachineFilter())):
            seconds = (r.updated_at - r.created_at).total_seconds()
            count = len(await queries.history(self.db, r.id))
            rows.append((r.kind, r.workload, r.source_node, r.phase, f"{seconds:.2f}", count))
        render.table(["kind", "workload", "source node", "outcome", "seconds", "events"], rows)
        say("report: checkpoints (SQL view report_checkpoints)")
        made = await reports.checkpoint_summaries(self.db)
        self.expect(len(made) == checkpoints and all(c["size_bytes"] for c in made),
                    f"the checkpoint report shows {len(made)} sized checkpoints, "
                    f"not {checkpoints}")
        render.table(["made by", "workload", "node", "class", "bytes", "capture s", "outcome"],
                     [(c["kind"], c["workload"], c["source_node"], c["class_name"],
                       c["size_bytes"], f"{float(c['capture_seconds']):.2f}",
                       c["operation_outcome"]) for c in made])
        [m] = await reports.migration_phases(self.db)
        say("the migration phase by phase (report_migrations): " + ", ".join(
            f"{p.removesuffix('_seconds')} {float(m[p]):.2f}s"
            for p in reports.MIGRATION_PHASES))
        if self.db_path is None:
            return
        db = f"--db sqlite:///{self.db_path}"
        say(f"the same with cpctl: `cpctl {db} list --wide` (every operation), "
            f"`cpctl {db} checkpoints` (the checkpoints), `cpctl {db} report migrations` "
            f"(phase by phase), `cpctl {db} history {mig[:8]}` (the history)")

    async def migrate_app(self) -> tuple[str, dict[str, Any]]:
        """Migrate ``app`` node-1 -> node-2; the operation id and the restored pod."""
        # As `cpctl migrate default/app --to node-2` asks it (the request path: the pod
        # read from the cluster, its template, the kept name).
        from controlplane.app.requests import parse, prepare_asked
        from controlplane.app.requests import submit as submit_request

        asked = parse("migration", {"workload": f"{NS}/app", "targetNode": "node-2",
                                    "class": self.klass})
        prepared = await prepare_asked(self.db, self.world.access(self.db), asked)
        outcome = await submit_request(self.db, default_kinds(), prepared,
                                       machine_id=new_id(), now=clock.now(),
                                       requester=os_identity())
        self.world.worker.nudge()
        mig = outcome.machine_id
        record = await self.follow(mig, "migrate app node-1 -> node-2")
        self.expect(record.phase == "Succeeded", f"migration ended {record.phase}")
        moved = self._restored("app")
        self.expect(moved["spec"].get("nodeName") == "node-2", "app is not on node-2")
        self.expect(moved["metadata"]["name"] == "app",
                    f"the restored pod is {moved['metadata']['name']}, not app")
        return mig, moved

    async def submit(self, kind: str, spec: JsonObject) -> str:
        outcome = await submit_operation(self.db, default_kinds(),
                                         self.world.submission_observer,
                                         kind=kind, spec=spec, machine_id=new_id(),
                                         now=clock.now(), requester=os_identity())
        self.world.worker.nudge()
        return outcome.machine_id

    async def follow(self, machine_id: str, label: str) -> MachineRecord:
        return await follow(self.db, machine_id, label, limit_seconds=60, prefix="[demo] ")

    def expect(self, condition: bool, what: str) -> None:
        if not condition:
            raise DemoFailed(f"demo check failed: {what}")

    def _pod(self, name: str) -> dict[str, Any]:
        pod = self.world.cluster.pod(NS, name)
        self.expect(pod is not None, f"{NS}/{name} is missing")
        assert pod is not None
        return dict(pod)

    def _phase(self, name: str) -> str | None:
        pod = self.world.cluster.pod(NS, name)
        return None if pod is None else (pod.get("status") or {}).get("phase")

    def _ref(self, name: str) -> JsonObject:
        return {"namespace": NS, "name": name, "uid": self._pod(name)["metadata"]["uid"]}

    def _template(self, name: str) -> JsonObject:
        pod = self._pod(name)
        return {"metadata": {"labels": dict(pod["metadata"].get("labels") or {})},
                "spec": {"containers": pod["spec"]["containers"]}}

    def _restored(self, original: str) -> dict[str, Any]:
        """The pod the agent restored for ``original`` (it carries restored-from-digest)."""
        for pod in self.world.cluster.store.peek("pods"):
            notes = pod["metadata"].get("annotations") or {}
            labels = pod["metadata"].get("labels") or {}
            if protocol.RESTORED_FROM_DIGEST in notes and (
                    pod["metadata"]["name"].startswith(original) or labels.get("app")
                    == original):
                return dict(pod)
        raise DemoFailed(f"no restored pod for {original}")

    async def _candidate(self, suspend_id: str) -> JsonObject:
        """The suspend's checkpoint, as a resume candidate (pinned by digest)."""
        return (await checkpoint_of(self.db, suspend_id)).candidate()


def _fresh_directory(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)


async def _replay(db: Database) -> bool:
    kinds = default_kinds()
    projections = await rebuild(db, kinds, now=clock.now())
    decisions = await verify(db, kinds)
    say(f"replay: {projections.machines} machines, {projections.events} events: "
        f"{len(projections.mismatches)} projection mismatches, "
        f"{len(decisions.mismatches)} decisions that would now differ")
    return projections.clean and decisions.clean
