"""One document per operation: the same fields in ``cpctl get/list -o json`` and the API.

``node`` is where the operation ran or landed (a finished migration's final node, a
restore's or resume's asked node, else the source's), ``workload`` the pod it acts on
(the table's WORKLOAD column), ``pod`` the pod it left running.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.app.operation_doc import node_of, operation_json, target_node
from controlplane.store.records import MachineRecord
from tests.support.cpctl import in_process, upgraded

T = datetime(2026, 1, 1, tzinfo=UTC)


def record(kind: str, spec: dict[str, Any], state: dict[str, Any] | None = None, *,
           source_node: str | None = None, phase: str = "Running") -> MachineRecord:
    return MachineRecord(id="op-1", kind=kind, phase=phase, version=3, spec=spec,
                         state=state or {}, terminal=False, pending_actions=[],
                         next_wake_at=None, wake_seq=0, lease_owner=None,
                         lease_expires_at=None, attempts=0, created_at=T, updated_at=T,
                         workload="default/web", source_node=source_node)


def test_the_node_is_where_the_operation_ran_or_landed() -> None:
    moving = record("migration", {"target_node": "node-2"}, source_node="node-1")
    landed = record("migration", {"target_node": "node-2"}, {"final_node": "node-3"},
                    source_node="node-1")
    restore = record("restore", {"node": "node-4"})
    drain = record("drain", {"node": "node-5"})
    assert [node_of(r) for r in (moving, landed, restore, drain)] == \
        ["node-1", "node-3", "node-4", "node-5"]
    assert [target_node(r) for r in (moving, restore, drain)] == ["node-2", "node-4", None]


def test_cpctl_prints_the_apis_document_for_each_operation(tmp_path: Path) -> None:
    db = upgraded(f"sqlite:///{tmp_path / 'cp.db'}")
    assert in_process(db, "submit", "steps", "--spec", '{"steps": 1}', "--id", "s1").returncode == 0
    listed = json.loads(in_process(db, "list", "-o", "json").stdout)["items"]
    got = json.loads(in_process(db, "get", "s1", "-o", "json").stdout)
    expected = set(operation_json(record("steps", {}), detail=True))
    assert set(listed[0]) == set(got) == expected
    assert {"workload", "node", "source_node", "target_node", "pod"} <= expected
