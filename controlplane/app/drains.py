"""Drains as use cases: the plan and the spec of a drain from the cluster as listed (what
``cpctl drain`` and ``POST /api/v1/operations`` submit, and what their dry runs show),
a drain's children as an operator reads them: the drain's own record of each child,
with the live phase of the ones in flight (``cpctl get``, ``cpctl drain --wait``, the
HTTP API's drain view), and :class:`NodeRecheck`, the handler of a drain's
``CheckNodePods`` action: the pods on its node the plan does not have, planned with the
planner's rules and sent back as the ``NodePodsListed`` command (built by the
composition root next to ``ChildSubmitter``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.app.operations import send_command
from controlplane.app.ports import ClusterAccess
from controlplane.app.requester import drain_requester
from controlplane.app.specs import template_of
from controlplane.clock import Clock
from controlplane.engine.decider import Action, Command
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import UsageError
from controlplane.machines.config.classes import artifact_for, parse_class
from controlplane.machines.drain.machine import NODE_PODS_LISTED
from controlplane.machines.drain.planning import (
    MIRROR,
    DrainPlan,
    PlanRejected,
    PodInfo,
    node_info,
    parse_selector,
    plan_drain,
    pod_info,
    selector_matches,
)
from controlplane.machines.drain.state import ChildStatus, DrainState
from controlplane.machines.owners import ADOPT, BARE, GATED
from controlplane.machines.submission import Limits
from controlplane.store import leases, queries
from controlplane.store.database import Database
from controlplane.store.errors import DatabaseUnavailable, MachineNotFound
from controlplane.store.records import MachineRecord
from controlplane.worker.errors import RetryableActionError, TerminalActionError


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
    #: When the pod joined the plan, found on the node after it was made (``None``: it
    #: was planned).
    joined_at: str | None = None

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
            started_at=_text(c.get("started_at")), finished_at=_text(c.get("finished_at")),
            joined_at=_text(c.get("joined_at"))))
    return out


def drain_summary(record: MachineRecord) -> dict[str, Any]:
    """A drain's node and its children counted by how far they got, from its state alone
    (no reads): the HTTP API's operation view and a Drain resource's ``status.drain``.
    A refused child counts as failed; one started and not finished as running. Pure."""
    raw = record.state.get("children")
    children = [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
    status = [str(c.get("status")) for c in children]
    moved = sum(1 for c in children
                if c.get("status") == ChildStatus.FINISHED and c.get("phase") == "Succeeded")
    return {"node": record.spec.get("node"), "children": len(status), "succeeded": moved,
            "failed": status.count(ChildStatus.FINISHED) - moved
            + status.count(ChildStatus.REFUSED),
            "running": status.count(ChildStatus.STARTED),
            "pending": status.count(ChildStatus.PENDING),
            "skipped": status.count(ChildStatus.SKIPPED)}


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
    """The drain machine's spec: the plan, with each pod's template to restore from; pods
    found on the node later are planned with the same targets and selector."""
    late: JsonObject = {"targets": list(plan.targets)}
    if plan.selector:
        late["selector"] = plan.selector
    return {"node": plan.node, "max_parallel": max_parallel, "class": klass,
            "children": _children(plan, pods), "left": _left(plan), "keep_names": True,
            "late_pods": late}


def _children(plan: DrainPlan, pods: Sequence[dict[str, Any]]) -> list[JsonValue]:
    raw = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    return [{
        "pod": {"namespace": m.pod.namespace, "name": m.pod.name, "uid": m.pod.uid},
        "target": m.target, "template": template_of(raw[m.pod.key]),
        **({"successor": m.pod.moved_by} if m.pod.moved_by != BARE else {})}
        for m in plan.moves]


def _left(plan: DrainPlan) -> list[JsonValue]:
    return [{"pod": x.pod.key, "reason": x.reason} for x in plan.left]


def late_pods(state: DrainState, nodes: list[dict[str, Any]],
              pods: list[dict[str, Any]]) -> JsonObject:
    """The pods on ``state``'s node its plan does not have, as the ``NodePodsListed``
    command's data (without ``check``): ``children`` to move and ``left`` (planned with
    the planner's rules, the plan's targets and selector), and ``starting`` (not Running
    yet). Pods on their way out (terminating, Succeeded, Failed) and the node's own
    (DaemonSet, mirror) are not the drain's business; pods the plan already has, moved,
    refused or left alone, stay as they are."""
    spec = state.spec
    known = {c.uid for c in state.children}
    left_alone = {pod for pod, _ in spec.left}
    movable = parse_class(spec.klass, field="class").movable_owners if spec.klass else ()
    infos = [pod_info(p, movable) for p in pods]
    late: list[PodInfo] = []
    starting: list[PodInfo] = []
    for p in infos:
        if p.node != spec.node or p.uid in known or p.key in left_alone:
            continue
        if p.deleting or p.phase in ("Succeeded", "Failed") or MIRROR in p.annotations \
                or "DaemonSet" in p.owner_kinds:
            continue
        (late if p.phase == "Running" else starting).append(p)
    if not late:
        return {"children": [], "left": [], "starting": _chosen(starting, spec.selector)}
    # Only the late pods are planned; the others on the node are leaving anyway and
    # take no room on a target.
    others = [p for p in infos if p.node != spec.node]
    try:
        plan = plan_drain(spec.node, [node_info(n) for n in nodes], [*others, *late],
                          targets=spec.targets, selector=spec.selector or None)
    except PlanRejected:  # the selector matches none of them, or the node is gone
        return {"children": [], "left": [], "starting": _chosen(starting, spec.selector)}
    return {"children": _children(plan, pods), "left": _left(plan),
            "starting": _chosen(starting, spec.selector)}


def _chosen(pods: Sequence[PodInfo], selector: str) -> list[JsonValue]:
    wanted = parse_selector(selector)
    return [p.key for p in pods if selector_matches(wanted, p.labels)]


class NodeRecheck:
    """The ``CheckNodePods`` handler: list the drain's node's pods from the API server and
    answer the drain's request with :func:`late_pods` (the ``NodePodsListed`` command,
    recorded as the drain's), then wake it. Re-performed, an answered request is done."""

    def __init__(self, db: Database, kinds: KindRegistry, access: ClusterAccess,
                 clock: Clock) -> None:
        self.db, self.kinds, self.access, self.clock = db, kinds, access, clock

    async def __call__(self, action: Action, /) -> None:
        drain, check = action.params.get("drain"), action.params.get("check")
        if not isinstance(drain, str) or not isinstance(check, int):
            raise TerminalActionError(f"CheckNodePods {action.key}: params drain (string) "
                                      "and check (integer) are required")
        try:
            record = await queries.get_machine(self.db, drain)
            state: DrainState = self.kinds.get(record.kind).load_state(record.state)
            if record.terminal or state.checks != check or not state.check_open:
                return  # answered already, or asked again since, or over
            nodes = [dict(n) for n in await self.access.list_nodes()]
            pods = [dict(p) for p in await self.access.list_pods()]
            data = {"check": check, **late_pods(state, nodes, pods)}
            await send_command(self.db, self.kinds, machine_id=drain,
                               command=Command(NODE_PODS_LISTED, data),
                               now=self.clock.now(), requester=drain_requester(drain))
            await leases.wake_machine(self.db, machine_id=drain, now=self.clock.now())
        except MachineNotFound as exc:
            raise TerminalActionError(f"drain {drain} does not exist") from exc
        except UsageError as exc:  # refused: the drain ended or was cancelled meanwhile
            raise TerminalActionError(str(exc)) from exc
        except DatabaseUnavailable as exc:
            raise RetryableActionError(str(exc)) from exc
        except Exception as exc:  # the API server did not answer: ask again
            raise RetryableActionError(f"{type(exc).__name__}: {exc}") from exc


#: What ``--dry-run`` says for each way a pod moves.
HOW = {
    BARE: "bare: restored under its own name",
    ADOPT: "adopted: restored beside its stopped source, then handed to its ReplicaSet, "
           "which scales the source away (no cold copy, the replica count kept)",
    GATED: "gated: its StatefulSet recreates it under the same name and claims, held by "
           "a scheduling gate until the restore request is on it",
}


@dataclass(frozen=True)
class Parallelism:
    """How many of a drain's children can be in flight at once: ``--max-parallel``,
    unless an admission limit is lower (every child leaves the same node, so
    ``--max-per-node`` holds them all; ``--max-operations`` counts the whole cluster)."""

    asked: int
    effective: int
    capped_by: str | None  # the flag that caps it, e.g. "--max-per-node 2"

    @property
    def warning(self) -> str | None:
        if self.capped_by is None:
            return None
        return (f"--max-parallel {self.asked} is capped by {self.capped_by}: at most "
                f"{self.effective} children run at once; raise {self.capped_by.split()[0]} "
                "here and on the workers (they admit the children) to run more")


def parallelism(max_parallel: int, limits: Limits) -> Parallelism:
    """The drain's effective parallelism under ``limits`` (pure)."""
    effective, capped_by = max_parallel, None
    for value, flag in ((limits.max_per_source_node, "--max-per-node"),
                        (limits.max_cluster, "--max-operations")):
        if value < effective:
            effective, capped_by = value, f"{flag} {value}"
    return Parallelism(max_parallel, effective, capped_by)


def plan_document(plan: DrainPlan, klass: JsonObject, max_parallel: int,
                  limits: Limits | None = None) -> JsonObject:
    """What ``--dry-run`` prints (``-o json``): the plan, the writes it would make, and
    the parallelism the admission ``limits`` leave (with a warning when they cap it)."""
    cls = parse_class(klass, field="--repository")
    run = parallelism(max_parallel, limits if limits is not None else Limits())
    doc = plan.to_json()
    doc.update({
        "dry_run": True, "max_parallel": max_parallel,
        "effective_parallel": run.effective, "capped_by": run.capped_by,
        "warnings": [run.warning] if run.warning else [],
        "would": [f"cordon node {plan.node} (spec.unschedulable=true)",
                  f"migrate {len(plan.moves)} pods, at most {run.effective} at a time"
                  + (f" ({run.capped_by} caps --max-parallel {max_parallel})"
                     if run.capped_by else "")],
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
