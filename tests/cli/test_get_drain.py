"""``cpctl get DRAIN`` (a real subprocess): the table output lists the drain's children —
id, pod, target, phase or outcome, reason — under the usual fields, in plan order, as the
drain recorded them; ``-o json`` is the record, unchanged.

The drain is real: three pods off node-1 on the embedded simulator, one of them deleted
between plan and drain so its child is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.app.operations import submit_operation
from controlplane.clock import new_id
from controlplane.machines.catalog import default_kinds
from controlplane.machines.drain.request import drain_spec
from controlplane.store import queries
from tests.cli.drain_world import NS, clock, drain_world
from tests.support.cpctl import cpctl

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Drained:
    db_url: str
    drain_id: str
    children: list[dict[str, Any]]  # the drain's state's children


@pytest.fixture
async def drained(tmp_path: Path) -> Drained:
    async with drain_world(tmp_path, pods=3) as w:
        plan = w.plan()
        spec = drain_spec(plan, list(w.cluster.store.peek("pods")), w.klass(), max_parallel=3)
        # All three start in one step and the FIRST is refused: the action runner stops at
        # that failure, so its siblings' submissions must be re-issued by the drain.
        gone = plan.moves[0].pod.name
        w.cluster.store.delete("pods", NS, gone, grace=0)
        outcome = await submit_operation(w.db, default_kinds(), w.world.submission_observer,
                                         kind="drain", spec=spec, machine_id=new_id(),
                                         now=clock.now())
        w.world.worker.nudge()
        record = await w.settled(outcome.machine_id)
        assert await queries.list_machines(w.db, queries.MachineFilter(settled=False)) == []
    children = record.state["children"]
    assert isinstance(children, list)
    return Drained(f"sqlite:///{tmp_path / 'cp.db'}", outcome.machine_id,
                   [c for c in children if isinstance(c, dict)])


def test_get_drain_prints_each_child_under_the_fields(drained: Drained) -> None:
    result = cpctl(drained.db_url, "get", drained.drain_id)
    assert result.returncode == 0, result.stderr
    fields, _, children = result.stdout.partition("\n\n")
    assert fields.startswith("FIELD")
    assert re.search(r"^phase +Failed$", fields, re.MULTILINE), fields
    header, *rows = children.rstrip("\n").split("\n")
    assert header.split() == ["CHILD", "POD", "TARGET", "PHASE/OUTCOME", "REASON", "JOINED"]
    assert [r.split()[:4] for r in rows] == [
        [c["id"], f"{NS}/{c['name']}", c["target"], c["phase"] or c["status"]]
        for c in drained.children]
    assert sorted(r.split()[3] for r in rows) == ["Refused", "Succeeded", "Succeeded"]
    [refused] = [r for r in rows if r.split()[3] == "Refused"]
    assert "unknown pod" in refused  # the reason, from the refused submission
    assert all(r.rstrip().endswith("planned") for r in rows)  # none joined late


def test_get_drain_as_json_or_yaml_is_the_record_without_a_children_table(
        drained: Drained) -> None:
    as_json = cpctl(drained.db_url, "get", drained.drain_id, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert sorted(record) == [  # the operation document (docs/api.md), with detail
        "attempts", "created_at", "drain", "held", "id", "kind", "lease_expires_at",
        "lease_owner", "next_wake_at", "node", "parent", "phase", "pod", "source_node",
        "spec", "state", "target_node", "terminal", "updated_at", "version", "waiting_for",
        "workload"]
    assert record["pod"] is None  # a drain restores no pod of its own
    assert (record["node"], record["target_node"]) == ("node-1", None)  # the node it empties
    assert [c["id"] for c in record["state"]["children"]] == [
        c["id"] for c in drained.children]
    as_yaml = cpctl(drained.db_url, "get", drained.drain_id, "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert "CHILD" not in as_yaml.stdout
