"""The drain decider's given/when/then vocabulary: a drain (:data:`DRAIN`) of
:data:`NODE` whose :func:`spec` plans ``pods`` children, what the worker :func:`seen`
(the node, cordoned or not, and the children's machines), a child's id
(:func:`child`) and its machine as observed (:func:`view`). Builds on
``tests/machines/machines_gwt.py``; used by ``tests/machines/test_drain_machine.py`` and
``tests/machines/test_drain_late_pods.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import MachineView, NodeView, Observation
from controlplane.machines.drain.machine import DrainDecider, child_id
from tests.machines.machines_gwt import REPO, TEMPLATE

DRAIN = "drain-1"
NODE = "node-a"


def spec(pods: int = 5, max_parallel: int = 2) -> JsonObject:
    children: list[Any] = [{"pod": {"namespace": "apps", "name": f"p{i}", "uid": f"uid-{i}"},
                            "target": "node-b" if i % 2 else "node-c", "template": TEMPLATE}
                           for i in range(pods)]
    raw: JsonObject = {"node": NODE, "max_parallel": max_parallel,
                       "class": {"repository": REPO}, "children": children,
                       "left": [{"pod": "apps/ds", "reason": "DaemonSet pod"}]}
    return DrainDecider().validate_spec(raw)


def seen(cordoned: bool, children: Mapping[str, MachineView | None] | None = None) -> Observation:
    return Observation(nodes={NODE: NodeView(NODE, ready=True, unschedulable=cordoned)},
                       machines=dict(children or {}))


def child(i: int) -> str:
    return child_id(DRAIN, f"uid-{i}")


def view(i: int, phase: str = "Restoring", terminal: bool = False,
         reason: str = "") -> MachineView:
    return MachineView(child(i), "migration", phase, terminal, reason)
