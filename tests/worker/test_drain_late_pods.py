"""Pods that reach a draining node after its plan are moved too, through the worker on the
simulator (the embedded product): one scheduled onto the node between the plan and the
submission (before the cordon took effect), one bound to it by ``nodeName`` once the
node is cordoned (the cordon stops the scheduler, not a direct bind). Both join the plan
(``PlanExtended``), are moved with their state, are counted in the drain's end, and
``cpctl get`` / ``--wait``'s summary show which joined late and when."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.app.operations import submit_operation
from controlplane.cli.drain import print_children
from controlplane.clock import new_id
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.request import drain_spec
from controlplane.store import queries
from drivers.sim import MARKER
from tests.cli.drain_world import NS, clock, drain_world
from tests.support.cpctl import cpctl
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow


async def test_pods_reaching_the_node_after_the_plan_are_moved_and_counted(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    async with drain_world(tmp_path, pods=2, db_url=db_url) as w:
        plan = w.plan()
        spec = drain_spec(plan, list(w.cluster.store.peek("pods")), w.klass(), max_parallel=2)
        w.cluster.create_pod(NS, "early-bird", node="node-1", cpu="100m", memory="64Mi",
                             marker="early-bird=v1", labels={"app": "early-bird"})
        await w.cluster.wait_for(lambda: "early-bird" in w.running_pods(),
                                 what="early-bird running", limit_seconds=30)
        drain_id = (await submit_operation(w.db, default_kinds(), w.world.submission_observer,
                                           kind="drain", spec=spec, machine_id=new_id(),
                                           now=clock.now())).machine_id
        w.world.worker.nudge()

        async def cordoned() -> bool:
            return w.node_unschedulable("node-1")
        await eventually(cordoned, limit_seconds=30, every=0.05, what="node-1 cordoned")
        w.cluster.store.create("pods", NS, {
            "metadata": {"name": "bound", "labels": {"app": "bound"},
                         "annotations": {MARKER: "bound=v1"}},
            "spec": {"nodeName": "node-1", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.9",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})

        record = await w.settled(drain_id, limit=110)
        assert record.phase == "Succeeded", record.state
        history = await queries.history(w.db, drain_id)
        joined = [c["namespace"] + "/" + c["name"] for e in history
                  if e.type == "PlanExtended" for c in e.data["children"]]  # type: ignore[union-attr,index,operator]
        assert sorted(joined) == [f"{NS}/bound", f"{NS}/early-bird"]
        finished = next(e for e in history if e.type == "DrainFinished")
        assert (finished.data["children"], finished.data["succeeded"]) == (4, 4)
        running = w.running_pods()
        for name in ("early-bird", "bound", *w.names):
            assert running[name]["spec"].get("nodeName") != "node-1", name
        assert w.marker_of("early-bird") == "early-bird=v1"
        assert w.marker_of("bound") == "bound=v1"
        # The drain ended only after a look at the node found nothing new.
        last_check = [e for e in history if e.type == "NodeRechecked"][-1]
        assert last_check.data["joined"] == 0
        assert not [p for p in w.cluster.store.peek("pods")
                    if p["spec"].get("nodeName") == "node-1"
                    and (p.get("status") or {}).get("phase") == "Running"]

        # What an operator reads: -o json has each extension (when, which pods) and
        # each late child's joined_at; the table lists the late children with the rest;
        # --wait's summary names them with the time they were found.
        as_json = cpctl(db_url, "get", drain_id, "-o", "json")
        assert as_json.returncode == 0, as_json.stderr
        state = json.loads(as_json.stdout)["state"]
        assert sorted(p for e in state["extensions"] for p in e["joined"]) == [
            f"{NS}/bound", f"{NS}/early-bird"]
        assert all(e["at"] for e in state["extensions"])
        late_children = {c["name"]: c.get("joined_at") for c in state["children"]}
        assert late_children["bound"]
        assert late_children["early-bird"]
        assert all(late_children[name] is None for name in w.names)
        table = cpctl(db_url, "get", drain_id)
        assert table.returncode == 0, table.stderr
        rows = {line.split()[1]: line for line in table.stdout.splitlines()
                if line.split() and line.split()[1].startswith(f"{NS}/")}
        assert late_children["bound"] in rows[f"{NS}/bound"]
        assert late_children["early-bird"] in rows[f"{NS}/early-bird"]
        assert all(rows[f"{NS}/{name}"].rstrip().endswith("planned") for name in w.names)
        await print_children(w.db, drain_id)
        # The answers are commands: replay re-runs them through accept, and the
        # projections fold back from the events.
        replayed = cpctl(db_url, "replay", "--verify")
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        found = [line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("found on the node after the plan, at ")]
        assert found
        assert "bound" in "".join(found)
        assert "early-bird" in "".join(found)
