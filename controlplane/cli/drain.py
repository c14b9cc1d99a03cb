"""What ``cpctl drain --wait`` and ``cpctl get`` print of a drain: each child and its
outcome, the pods left alone, and the extensions of its plan. (The verb itself is one
of the operation verbs: :mod:`controlplane.cli.cluster`.)
"""

from __future__ import annotations

from controlplane.app.drains import drain_children
from controlplane.cli import render
from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import queries
from controlplane.store.database import Database


async def print_children(db: Database, drain_id: str) -> None:
    """Each child of a drain and its outcome (``cpctl get`` on a drain shows the same)."""
    record = await queries.get_machine(db, drain_id)
    rows = [(c.pod, c.target, c.id, c.status, c.phase or "-", c.reason or "-")
            for c in await drain_children(db, record)]
    if rows:
        render.table(["pod", "target", "child", "status", "outcome", "reason"], rows,
                     max_width=60)
    for pod_reason in record.state["spec"].get("left") or []:  # type: ignore[union-attr]
        assert isinstance(pod_reason, list)
        print(f"left alone: {pod_reason[0]}: {pod_reason[1]}")
    for line in late_lines(record.state):
        print(line)


def late_lines(state: JsonObject) -> list[str]:
    """One line per extension of the plan: when, which pods joined it, which were left."""
    out = []
    extensions = state.get("extensions")
    for ext in extensions if isinstance(extensions, list) else []:
        assert isinstance(ext, dict)
        joined = ", ".join(_strings(ext.get("joined"))) or "-"
        left = ", ".join(_strings(ext.get("left"))) or "-"
        out.append(f"found on the node after the plan, at {ext.get('at')}: moved {joined}; "
                   f"left alone {left}")
    return out


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
