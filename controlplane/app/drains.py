"""Drains as use cases: the plan and the spec of a drain from the cluster as listed (what
``cpctl drain`` and ``POST /api/v1/operations`` submit, and what their dry runs show),
and a drain's children as an operator reads them: the drain's own record of each child,
with the live phase of the ones in flight (``cpctl get``, ``cpctl drain --wait``, the
HTTP API's drain view)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.app.specs import template_of
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.errors import UsageError
from controlplane.machines.config.classes import artifact_for, parse_class
from controlplane.machines.drain.planning import (
    DrainPlan,
    PlanRejected,
    node_info,
    plan_drain,
    pod_info,
)
from controlplane.machines.drain.state import ChildStatus
from controlplane.machines.owners import ADOPT, BARE, GATED
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound
from controlplane.store.records import MachineRecord


@dataclass(frozen=True)
class DrainChild:
    """One pod of a drain's plan. ``phase`` is the child migration's phase: live for one
    in flight (one read each, at most the drain's ``max_parallel``), as the drain recorded
    it for one finished, ``None`` while it is not submitted yet or was never started."""

    id: str
    pod: str
    target: str
    status: str
    phase: str | None
    reason: str | None
    started_at: str | None
    finished_at: str | None

    @property
    def outcome(self) -> str:
        """How far it got: the phase when there is one, else the drain's status."""
        return self.phase or self.status


async def drain_children(db: Database, record: MachineRecord) -> list[DrainChild]:
    """The children of drain ``record``, in plan order."""
    raw = record.state.get("children")
    out: list[DrainChild] = []
    for c in raw if isinstance(raw, list) else []:
        if not isinstance(c, dict):
            continue
        phase = str(c.get("phase") or "") or None
        if c.get("status") == ChildStatus.STARTED:
            try:
                phase = (await queries.get_machine(db, str(c.get("id")))).phase
            except MachineNotFound:  # started; its SubmitOperation not performed yet
                phase = None
        out.append(DrainChild(
            id=str(c.get("id")), pod=f"{c.get('namespace')}/{c.get('name')}",
            target=str(c.get("target")), status=str(c.get("status")), phase=phase,
            reason=str(c.get("reason") or "") or None,
            started_at=_text(c.get("started_at")), finished_at=_text(c.get("finished_at"))))
    return out


def _text(value: object) -> str | None:
    return None if value is None else str(value)


ID_PLACEHOLDER = "<child-id>"


def plan_of(node: str, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], *,
            targets: Sequence[str] = (), selector: str | None = None,
            klass: JsonObject | None = None) -> DrainPlan:
    """Which pods leave ``node`` and where each goes, from the cluster as listed (owner
    kinds ``klass`` declares movable move as bare pods)."""
    movable = parse_class(klass, field="class").movable_owners if klass else ()
    try:
        return plan_drain(node, [node_info(n) for n in nodes],
                          [pod_info(p, movable) for p in pods],
                          targets=tuple(targets), selector=selector)
    except PlanRejected as exc:
        raise UsageError(f"drain {node} refused: {exc}") from None


def drain_spec(plan: DrainPlan, pods: list[dict[str, Any]], klass: JsonObject,
               max_parallel: int) -> JsonObject:
    """The drain machine's spec: the plan, with each pod's template to restore from."""
    raw = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    children: list[JsonValue] = [{
        "pod": {"namespace": m.pod.namespace, "name": m.pod.name, "uid": m.pod.uid},
        "target": m.target, "template": template_of(raw[m.pod.key]),
        **({"successor": m.pod.moved_by} if m.pod.moved_by != BARE else {})}
        for m in plan.moves]
    left: list[JsonValue] = [{"pod": x.pod.key, "reason": x.reason} for x in plan.left]
    return {"node": plan.node, "max_parallel": max_parallel, "class": klass,
            "children": children, "left": left, "keep_names": True}


#: What ``--dry-run`` says for each way a pod moves.
HOW = {
    BARE: "bare: restored under its own name",
    ADOPT: "adopted: restored beside its stopped source, then handed to its ReplicaSet, "
           "which scales the source away (no cold copy, the replica count kept)",
    GATED: "gated: its StatefulSet recreates it under the same name and claims, held by "
           "a scheduling gate until the restore request is on it",
}


def plan_document(plan: DrainPlan, klass: JsonObject, max_parallel: int) -> JsonObject:
    """What ``--dry-run`` prints (``-o json``): the plan, the writes it would make."""
    cls = parse_class(klass, field="--repository")
    doc = plan.to_json()
    doc.update({
        "dry_run": True, "max_parallel": max_parallel,
        "would": [f"cordon node {plan.node} (spec.unschedulable=true)",
                  f"migrate {len(plan.moves)} pods, at most {max_parallel} at a time"],
        "artifacts_written": [artifact_for(cls, checkpoint_id=ID_PLACEHOLDER,
                                           namespace=m.pod.namespace, pod=m.pod.name)
                              for m in plan.moves],
        "artifacts_deleted": "each one, after its pod is verified running on the target",
        "refused": [{"pod": x.pod.key, "reason": x.reason} for x in plan.left],
        # How each pod moves (machines.owners); the refused ones are above, each with
        # its owner named.
        "how": [{"pod": m.pod.key, "how": HOW[m.pod.moved_by]} for m in plan.moves],
    })
    return doc
