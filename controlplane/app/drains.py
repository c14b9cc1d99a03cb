"""Drains as use cases (a drain is asked for as any operation is: ``app.requests``, with
its plan in ``machines.drain.request``): a drain's children as an operator reads them:
the drain's own record of each child, with the live phase of the ones in flight
(``cpctl get``, ``cpctl drain --wait``, the HTTP API's drain view), and
:class:`NodeRecheck`, the handler of a drain's ``CheckNodePods`` action: the pods on its
node the plan does not have, planned with the planner's rules and sent back as the
``NodePodsListed`` command (built by the composition root next to ``ChildSubmitter``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.app.operations import send_command
from controlplane.app.ports import ClusterAccess
from controlplane.app.requester import drain_requester
from controlplane.clock import Clock
from controlplane.engine.decider import Action, CommandRejected
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import UsageError
from controlplane.machines.config.classes import parse_class
from controlplane.machines.drain.machine import NodePodsListed
from controlplane.machines.drain.planning import (
    MIRROR,
    PlanRejected,
    PodInfo,
    node_info,
    parse_selector,
    plan_drain,
    pod_info,
    selector_matches,
)
from controlplane.machines.drain.request import children_of, left_of
from controlplane.machines.drain.state import ChildStatus, DrainState
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
    return {"children": children_of(plan, pods), "left": left_of(plan),
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
            answer = NodePodsListed.from_data({"check": check, **late_pods(state, nodes, pods)})
            await send_command(self.db, self.kinds, machine_id=drain, command=answer,
                               now=self.clock.now(), requester=drain_requester(drain))
            await leases.wake_machine(self.db, machine_id=drain, now=self.clock.now())
        except MachineNotFound as exc:
            raise TerminalActionError(f"drain {drain} does not exist") from exc
        # Refused: the drain ended or was cancelled meanwhile (or, a bug, the answer
        # does not fit its command): asking again would not help.
        except (UsageError, CommandRejected) as exc:
            raise TerminalActionError(str(exc)) from exc
        except DatabaseUnavailable as exc:
            raise RetryableActionError(str(exc)) from exc
        except Exception as exc:  # the API server did not answer: ask again
            raise RetryableActionError(f"{type(exc).__name__}: {exc}") from exc


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
