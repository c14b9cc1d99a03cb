"""A drain as asked for: every movable pod off ``node``, with the class ``class``, onto
``targets`` (default: any other Ready node), only the pods ``selector`` matches, at most
``maxParallel`` at a time. It lists the cluster and plans with the pure planner
(:func:`~controlplane.machines.drain.planning.plan_drain`): the plan is its spec. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.observation import Interests, Observation
from controlplane.machines.base import requests as rq
from controlplane.machines.config.classes import artifact_for, parse_class
from controlplane.machines.drain.machine import MAX_PARALLEL
from controlplane.machines.drain.planning import (
    DrainPlan,
    PlanRejected,
    node_info,
    plan_drain,
    pod_info,
)
from controlplane.machines.owners import ADOPT, BARE, GATED

#: A drain's children in flight when the request does not say.
DEFAULT_MAX_PARALLEL = 4
#: The child id a plan names its artifacts under (the real one is made at submit).
CHILD_ID = "CHILD-ID"
#: How each way a pod moves is said (``machines.owners``).
HOW = {
    BARE: "bare: restored under its own name",
    ADOPT: "adopted: restored beside its stopped source, then handed to its ReplicaSet, "
           "which scales the source away (no cold copy, the replica count kept)",
    GATED: "gated: its StatefulSet recreates it under the same name and claims, held by "
           "a scheduling gate until the restore request is on it",
}


@dataclass(frozen=True)
class DrainRequest:
    node: str
    klass: JsonObject
    targets: tuple[str, ...]
    selector: str | None
    max_parallel: int
    fields: rq.Fields

    def lookups(self) -> rq.Lookups:
        return rq.Lookups()

    def reads(self, found: rq.Found) -> rq.Reads:
        return rq.Reads(cluster=True)

    def build(self, seen: rq.Seen) -> rq.Built:
        pods = [dict(p) for p in seen.all_pods]
        try:
            plan = plan_of(self.node, [dict(n) for n in seen.nodes], pods,
                           targets=self.targets, selector=self.selector, klass=self.klass)
        except PlanRejected as exc:
            raise self.fields.reject("node", f"drain {self.node} refused: {exc}") from None
        shown = plan.to_json()
        shown["moves"] = [{**move, "how": HOW[m.pod.moved_by]}
                          for move, m in zip(_rows(shown.get("moves")), plan.moves,
                                             strict=True)]
        cls = parse_class(self.klass, field="class")
        shown["artifacts_written"] = [
            artifact_for(cls, checkpoint_id=CHILD_ID, namespace=m.pod.namespace,
                         pod=m.pod.name) for m in plan.moves]
        shown["max_parallel"] = self.max_parallel
        return rq.Built(drain_spec(plan, pods, self.klass, self.max_parallel), shown)


def _rows(value: JsonValue) -> list[JsonObject]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def plan_of(node: str, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], *,
            targets: Sequence[str] = (), selector: str | None = None,
            klass: JsonObject | None = None) -> DrainPlan:
    """Which pods leave ``node`` and where each goes, from the cluster as listed (owner
    kinds ``klass`` declares movable move as bare pods); ``PlanRejected`` says why not."""
    movable = parse_class(klass, field="class").movable_owners if klass else ()
    return plan_drain(node, [node_info(n) for n in nodes],
                      [pod_info(p, movable) for p in pods],
                      targets=tuple(targets), selector=selector)


def drain_spec(plan: DrainPlan, pods: Sequence[Mapping[str, Any]], klass: JsonObject,
               max_parallel: int) -> JsonObject:
    """The drain machine's spec: the plan, with each pod's template to restore from; pods
    found on the node later are planned with the same targets and selector."""
    late: JsonObject = {"targets": list(plan.targets)}
    if plan.selector:
        late["selector"] = plan.selector
    return {"node": plan.node, "max_parallel": max_parallel, "class": klass,
            "children": children_of(plan, pods), "left": left_of(plan), "keep_names": True,
            "late_pods": late}


def children_of(plan: DrainPlan, pods: Sequence[Mapping[str, Any]]) -> list[JsonValue]:
    """The plan's moves as the drain's children (each with its pod's template)."""
    raw = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    return [{
        "pod": {"namespace": m.pod.namespace, "name": m.pod.name, "uid": m.pod.uid},
        "target": m.target, "template": rq.template_of(raw[m.pod.key]),
        **({"successor": m.pod.moved_by} if m.pod.moved_by != BARE else {})}
        for m in plan.moves]


def left_of(plan: DrainPlan) -> list[JsonValue]:
    """The pods the plan leaves alone, and why."""
    return [{"pod": x.pod.key, "reason": x.reason} for x in plan.left]


class DrainRequests:
    """The ``drain`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> DrainRequest:
        node = fields.required("node", "name the node to drain")
        klass = fields.object("class", required=rq.CLASS_HINT)
        assert klass is not None
        request = DrainRequest(
            node, klass, fields.names("targets"), fields.text("selector"),
            fields.integer("maxParallel", default=DEFAULT_MAX_PARALLEL, low=1,
                           high=MAX_PARALLEL), fields)
        fields.done()
        return request

    def interests(self, spec: JsonObject) -> Interests:
        return Interests()  # it moves nothing itself: each child is checked as submitted

    def check(self, spec: JsonObject, observation: Observation) -> None:
        return None

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        # One live drain per node; "node:" cannot be a namespace name.
        return f"node:{spec['node']}", None
