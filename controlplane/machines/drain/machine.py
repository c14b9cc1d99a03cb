"""The ``drain`` machine: empty a node — cordon it, then run its pods' migrations within
limits, as child machines, until every child is terminal.

Phases::

    Cordoning --NodeCordoned--> Draining --(every child terminal)--> Succeeded | Failed
    Draining --CancelRequested .. (running children settled)--> Uncordoning
        --NodeUncordoned--> Cancelled          (a node we did not cordon stays cordoned)

- **Cordon** is an action (``SetNodeUnschedulable``), recorded as ``CordonRequested``;
  ``NodeCordoned`` is appended only once the node is *observed* unschedulable. A node
  already cordoned is recorded as such (``already``) and never uncordoned by us.
- **Children**: the plan (pods, targets) is in the spec — it is the plan the operator saw
  (``cpctl drain --dry-run`` prints the same one). ``ChildStarted`` + a
  ``SubmitOperation`` action create a ``migration`` whose id is derived from the drain id
  and the pod UID, so a crash between commit and action never makes two. The drain
  observes its children from the store (``Interests.machines``) and keeps at most
  ``max_parallel`` in flight (a child held by admission limits counts as in flight, so
  the cluster and per-node limits still apply). A child that ends wakes the drain (the
  worker wakes its :func:`~controlplane.machines.drain.state.machine_key`, which the
  drain indexes); the drain re-reads them every 30 s only as a safety net. A child
  refused at submission (pod gone, workload busy) is ``Refused``; a terminal child is
  ``ChildFinished`` with its phase.
- **Cancel** stops starting children (the pending ones are ``ChildrenSkipped``), lets the
  running ones finish (a migration is never abandoned half-way), then uncordons.
- A failed child does not stop the others; the drain ends ``Failed`` when any child did
  not succeed, and the node stays cordoned (the operator decides what next).
- **Pods that reach the node after the plan** (bound before the cordon took effect, or
  pending pods scheduled there; spec ``late_pods``): once every child settled, the drain
  asks for its node's pods again (``NodeRecheckRequested`` + a ``CheckNodePods`` action,
  whose handler plans them with the planner's rules and answers with the
  ``NodePodsListed`` command). New pods join the plan (``PlanExtended``: moved like the
  planned ones, or left alone with the reason) and the drain asks again once they
  settled; pods not Running yet are looked at again every 2 s (for at most 5 minutes,
  then the drain fails: they stay). It ends only after an answer adds nothing
  (``NodeRechecked``). Drains recorded without ``late_pods`` never ask.

Spec: ``node``, ``max_parallel``, ``class``, ``children`` (``[{pod: {namespace, name,
uid}, target, template}]``), ``left`` (``[{pod, reason}]``: reported, never touched),
``keep_names``, ``late_pods`` (``{targets, selector}`` the plan was made with).
Commands: ``Cancel``, ``NodePodsListed`` (from the drain's own check). Registered by
:func:`controlplane.machines.catalog.product_kinds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.engine.commands import Command, CommandSet
from controlplane.engine.decider import (
    Action,
    CommandLike,
    CommandRejected,
    Decision,
    Event,
    EventLike,
    InvalidSpec,
)
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.observation import (
    Interests,
    MachineView,
    NodeView,
    Observation,
    ProbeError,
)
from controlplane.machines.base.codec import RawJson, decode
from controlplane.machines.base.commands import Cancel
from controlplane.machines.base.events import DomainEvent, Started
from controlplane.machines.base.facts import node_facts, with_facts
from controlplane.machines.base.specs import (
    class_json,
    node_name,
    only_known,
    pod_ref,
    pod_template,
    require,
)
from controlplane.machines.base.stepping import Step, emit, wait
from controlplane.machines.base.timing import REISSUE_AFTER
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.events import (
    ChildFinished,
    ChildOutcome,
    ChildrenSkipped,
    ChildStarted,
    CordonRequested,
    DrainCancelRequested,
    DrainFinished,
    LateChild,
    LateLeft,
    NodeCordoned,
    NodeRechecked,
    NodeRecheckRequested,
    NodeUncordoned,
    PlanExtended,
    UncordonRequested,
)
from controlplane.machines.drain.state import (
    KIND,
    Child,
    DrainPhase,
    DrainSpec,
    DrainState,
    child_id,
    evolve_drain,
    submit_key,
)

MAX_PARALLEL = 100


@dataclass(frozen=True)
class NodePodsListed(Command):
    """The answer to a drain's ``CheckNodePods`` action (``app.drains.NodeRecheck``),
    sent as the drain's own command: the pods on its node its plan does not have, for
    check ``check``. ``children``: ``{pod, target, template, successor?}`` to move;
    ``left``: ``{pod, reason}``; ``starting``: pods not Running yet."""

    check: int
    children: tuple[RawJson, ...]
    left: tuple[RawJson, ...]
    starting: tuple[str, ...]


NODE_PODS_LISTED = NodePodsListed.NAME
#: The commands a drain accepts (``NodePodsListed`` only from its own check).
_COMMANDS = CommandSet("drain", Cancel, NodePodsListed)
#: The action that lists the drain's node's pods and answers with ``NodePodsListed``.
CHECK_NODE_PODS = "drain.CheckNodePods"
#: An unanswered check (its action failed for good, or its worker died) is asked again.
CHECK_ANSWER_WITHIN = timedelta(seconds=60)
#: Pods bound to the node but not Running yet are looked at again this often, and for at
#: most this long before the drain gives up on them (Failed: they stay on the node).
STARTING_RECHECK = timedelta(seconds=2)
STARTING_GRACE = timedelta(minutes=5)
#: How often a drain that waits for its node's cordon (or uncordon) to be observed looks
#: again (nodes have no wake index).
NODE_POLL = timedelta(milliseconds=500)
#: The safety re-check of a drain with children in flight. It is woken when a child ends
#: (the worker wakes the children's ``machine_key``) and on its children's pod watch
#: events; this only bounds how long a lost wake (a worker killed between a child's last
#: commit and the wake) can hold it up.
CHILDREN_RECHECK = timedelta(seconds=30)


def set_node_unschedulable(key: str, *, node: str, unschedulable: bool) -> Action:
    """Cordon (``True``) or uncordon a node: patch ``spec.unschedulable``."""
    return Action(ActionType.SET_NODE_UNSCHEDULABLE, key,
                  {"node": node, "unschedulable": unschedulable})


def check_node_pods(key: str, *, drain: str, node: str, check: int) -> Action:
    """List ``node``'s pods and answer drain ``drain``'s request ``check``."""
    return Action(CHECK_NODE_PODS, key, {"drain": drain, "node": node, "check": check})


def submit_operation(key: str, *, machine_id: str, kind: str, spec: JsonObject,
                     parent: str) -> Action:
    """Submit a child operation with this id (done if it already exists)."""
    return Action(ActionType.SUBMIT_OPERATION, key, {"machine_id": machine_id, "kind": kind,
                                          "spec": spec, "parent": parent})


class DrainDecider:
    """The ``drain`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("node", "max_parallel", "class", "children", "left", "keep_names",
                          "late_pods"))
        node = node_name(require(spec, "node"), field="spec.node")
        parallel = spec.get("max_parallel", 4)
        if isinstance(parallel, bool) or not isinstance(parallel, int) or not (
                1 <= parallel <= MAX_PARALLEL):
            raise InvalidSpec(f"spec.max_parallel must be an integer from 1 to {MAX_PARALLEL}, "
                              f"got {parallel!r}")
        children = _children_json(spec.get("children"), "spec.children", node)
        left = spec.get("left") or []
        if not isinstance(left, list) or not all(
                isinstance(x, dict) and isinstance(x.get("pod"), str)
                and isinstance(x.get("reason"), str) for x in left):
            raise InvalidSpec("spec.left must be a list of {pod, reason} strings")
        keep = spec.get("keep_names", False)
        if not isinstance(keep, bool):
            raise InvalidSpec(f"spec.keep_names {keep!r} is not true or false: true lets each "
                              "moved pod keep its name")
        out: JsonObject = {"node": node, "max_parallel": parallel,
                           "class": class_json(spec.get("class")), "children": children,
                           "left": list(left)}
        if keep:
            out["keep_names"] = True
        late = spec.get("late_pods")
        if late is not None:
            out["late_pods"] = _late_pods_json(late, node)
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> DrainState:
        klass = spec.get("class")
        assert isinstance(klass, dict)
        left = tuple((str(x["pod"]), str(x["reason"])) for x in _list(spec, "left")
                     if isinstance(x, dict))
        children = []
        for raw in _list(spec, "children"):
            assert isinstance(raw, dict)
            ref = pod_ref(raw["pod"])
            template = raw["template"]
            assert isinstance(template, dict)
            children.append(Child(child_id(machine_id, ref.uid), ref.namespace, ref.name,
                                  ref.uid, str(raw["target"]), template,
                                  successor=str(raw.get("successor") or "")))
        max_parallel = spec.get("max_parallel", 4)
        assert isinstance(max_parallel, int)
        late = spec.get("late_pods")
        targets = late.get("targets") if isinstance(late, dict) else None
        return DrainState(machine_id, DrainSpec(
            str(spec["node"]), max_parallel, klass, left,
            keep_names=spec.get("keep_names") is True, late_pods=isinstance(late, dict),
            targets=tuple(str(t) for t in targets) if isinstance(targets, list) else (),
            selector=str(late.get("selector") or "") if isinstance(late, dict) else ""),
            tuple(children))

    def interests(self, state: DrainState) -> Interests:
        if state.terminal:
            return Interests()
        machines = frozenset(c.id for c in state.in_flight)
        return Interests(nodes=frozenset({state.spec.node}), machines=machines)

    def decide(self, state: DrainState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            opening = Started(at=now, kind=KIND, node=state.spec.node)
            started = opening.recorded()
            rest = self.decide(self.evolve(state, opening), observation, now)
            return with_facts(Decision((started, *rest.events), rest.actions, rest.wake_at),
                              observation)
        return with_facts(self._step(state, observation, now).decision(), observation)

    def _step(self, state: DrainState, obs: Observation, now: datetime) -> Step:
        node = state.spec.node
        fact = obs.nodes.get(node)
        facts = node_facts(node, fact)
        if state.node_error:
            return _finish(now, DrainPhase.FAILED, "NodeUpdateFailed",
                           f"could not update node {node}: {state.node_error}", state)
        if state.status is DrainPhase.CORDONING:
            return self._cordon(state, fact, facts, now)
        if state.status is DrainPhase.UNCORDONING:
            return self._uncordon(state, fact, facts, now)
        finished = [ChildFinished(
            at=now, child=c.id, pod=c.pod_key, target=c.target, phase=seen.phase,
            reason=seen.reason, succeeded=seen.phase == "Succeeded",
        ).recorded({"child": c.id, "phase": seen.phase})
            for c in state.in_flight
            if isinstance(seen := obs.machines.get(c.id), MachineView) and seen.terminal]
        if finished:
            return emit(*finished)
        # A started child the store definitely does not have: its SubmitOperation never
        # ran (an earlier action of the same decision failed, and the runner stops at the
        # first failure). Submitting again is safe: same id, same key, "exists" is done.
        lost = [c for c in state.in_flight
                if c.id in obs.machines and obs.machines[c.id] is None]
        if lost:
            return emit(actions=[self._submit(state, c) for c in lost])
        if state.cancelled and state.pending:
            return emit(ChildrenSkipped(at=now, children=tuple(c.id for c in state.pending),
                                        reason="cancelled").recorded())
        room = state.spec.max_parallel - len(state.in_flight)
        if not state.cancelled and state.pending and room > 0:
            return self._start(state, state.pending[:room], now)
        if state.in_flight:
            # Children running (or held by admission, or not yet created by the action):
            # the first to end wakes the drain.
            return wait(now + CHILDREN_RECHECK)
        if state.cancelled:
            if state.cordoned_by_us:
                return self._uncordon(state, fact, facts, now)
            return _finish(now, DrainPhase.CANCELLED, "Cancelled",
                           f"cancelled; node {node} was cordoned before the drain and stays "
                           "cordoned", state)
        if state.spec.late_pods:
            looking = self._look_again(state, now)
            if looking is not None:
                return looking
        counts = state.counts()
        if counts["failed"]:
            return _finish(now, DrainPhase.FAILED, "ChildrenFailed",
                           f"{counts['failed']} of {counts['children']} pods were not moved; "
                           f"node {node} stays cordoned", state)
        late = sum(1 for c in state.children if c.joined_at is not None)
        return _finish(now, DrainPhase.SUCCEEDED, "Drained",
                       f"moved {counts['succeeded']} pods off {node}"
                       f"{f' ({late} found after the plan)' if late else ''}; "
                       f"{len(state.spec.left)} left alone; node stays cordoned", state)

    def _look_again(self, state: DrainState, now: datetime) -> Step | None:
        """Every child settled: before it ends, the drain asks for its node's pods again
        (``CheckNodePods``; the answer is the ``NodePodsListed`` command) until an answer
        adds nothing and finds nothing still starting. ``None``: it may end."""
        if state.check_open:
            assert state.check_requested_at is not None
            due = state.check_requested_at + CHECK_ANSWER_WITHIN
            return wait(due) if now < due else self._request_check(state, now)
        if state.checks == 0 or state.checked_joined:
            return self._request_check(state, now)  # the first look, or after late children
        if not state.starting:
            return None
        assert state.starting_since is not None
        assert state.check_requested_at is not None
        if now >= state.starting_since + STARTING_GRACE:
            return _finish(now, DrainPhase.FAILED, "LatePodsNotRunning",
                           f"{len(state.starting)} pods on node {state.spec.node} did not "
                           f"start within {STARTING_GRACE}: {', '.join(state.starting)}; "
                           "node stays cordoned", state)
        due = state.check_requested_at + STARTING_RECHECK
        return wait(due) if now < due else self._request_check(state, now)

    def _request_check(self, state: DrainState, now: datetime) -> Step:
        check = state.checks + 1
        return emit(NodeRecheckRequested(at=now, node=state.spec.node, check=check).recorded(
            {"children": len(state.children), "left": len(state.spec.left)}), actions=[
            check_node_pods(f"{state.machine_id}:recheck:{check}", drain=state.machine_id,
                            node=state.spec.node, check=check)])

    def _cordon(self, state: DrainState, fact: NodeView | ProbeError | None,
                facts: JsonObject, now: datetime) -> Step:
        node = state.spec.node
        if isinstance(fact, ProbeError):
            return wait(now + NODE_POLL)  # unknown is not "schedulable": ask again
        if fact is None:
            return _finish(now, DrainPhase.FAILED, "NodeGone",
                           f"node {node} no longer exists", state, facts)
        if fact.unschedulable:
            return emit(NodeCordoned(at=now, node=node, already=not state.cordoned_by_us
                                     ).recorded(facts))
        due = state.cordon_requested_at is None or now >= state.cordon_requested_at + \
            REISSUE_AFTER
        if not due:
            return wait(now + NODE_POLL)
        return emit(CordonRequested(at=now, node=node).recorded(facts), actions=[
            set_node_unschedulable(f"{state.machine_id}:cordon", node=node,
                                   unschedulable=True)])

    def _uncordon(self, state: DrainState, fact: NodeView | ProbeError | None,
                  facts: JsonObject, now: datetime) -> Step:
        node = state.spec.node
        if isinstance(fact, ProbeError):
            return wait(now + NODE_POLL)
        if fact is None or not fact.unschedulable:
            uncordoned = NodeUncordoned(at=now, node=node)
            end = _finish(now, DrainPhase.CANCELLED, "Cancelled",
                          f"cancelled; running children finished, node {node} uncordoned",
                          evolve_drain(state, uncordoned))
            return emit(uncordoned.recorded(facts), *end.events)
        requested = state.uncordon_requested_at
        if state.status is DrainPhase.UNCORDONING and requested is not None and \
                now < requested + REISSUE_AFTER:
            return wait(now + NODE_POLL)
        return emit(UncordonRequested(at=now, node=node).recorded(facts), actions=[
            set_node_unschedulable(f"{state.machine_id}:uncordon", node=node,
                                   unschedulable=False)])

    def _submit(self, state: DrainState, c: Child) -> Action:
        spec: JsonObject = {
            "pod": {"namespace": c.namespace, "name": c.name, "uid": c.uid},
            "source_node": state.spec.node, "target_node": c.target,
            "template": c.template, "class": state.spec.klass}
        if c.successor:  # its controller names the restored pod
            spec["successor"] = c.successor
        elif state.spec.keep_names:
            spec["keep_name"] = True
        return submit_operation(submit_key(state.machine_id, c.id), machine_id=c.id,
                                kind="migration", spec=spec, parent=state.machine_id)

    def _start(self, state: DrainState, children: Sequence[Child], now: datetime) -> Step:
        events: list[Event] = []
        actions: list[Action] = []
        for c in children:
            events.append(ChildStarted(
                at=now, child=c.id, pod=c.pod_key, uid=c.uid, target=c.target,
                in_flight=len(state.in_flight) + len(events) + 1,
            ).recorded({"max_parallel": state.spec.max_parallel}))
            actions.append(self._submit(state, c))
        return emit(*events, actions=actions)

    def evolve(self, state: DrainState, event: EventLike | DomainEvent) -> DrainState:
        return evolve_drain(state, event)

    def accept(self, state: DrainState, command: CommandLike, now: datetime) -> Sequence[Event]:
        typed_command = _COMMANDS.decode(command)
        if state.terminal:
            raise CommandRejected(f"drain {state.machine_id} is already {state.phase}")
        if isinstance(typed_command, NodePodsListed):
            return _listed(state, typed_command, now)
        if state.cancelled:
            return ()
        return (DrainCancelRequested(at=now, in_flight=len(state.in_flight),
                                     pending=len(state.pending)).recorded({"command": "Cancel"}),)

    def load_state(self, data: JsonObject) -> DrainState:
        return decode(DrainState, data)


def _listed(state: DrainState, answer: NodePodsListed, now: datetime) -> Sequence[Event]:
    """The answer to check ``answer.check``: the pods not in the plan join it (or are left,
    with the reason), those not Running yet are noted. An answer to an earlier request,
    or one that comes after a cancel, adds nothing."""
    if answer.check != state.checks or not state.check_open or state.cancelled:
        return ()
    node = state.spec.node
    try:
        listed: list[JsonValue] = [*answer.children]
        raw = _children_json(listed, "children", node)
    except InvalidSpec as exc:
        raise CommandRejected(str(exc)) from None
    known = {c.uid for c in state.children}
    joined: list[LateChild] = []
    for c in raw:
        assert isinstance(c, dict)
        ref, template = pod_ref(c["pod"]), c["template"]
        assert isinstance(template, dict)
        if ref.uid not in known:
            joined.append(LateChild(child_id(state.machine_id, ref.uid), ref.namespace,
                                    ref.name, ref.uid, str(c["target"]),
                                    str(c.get("successor") or ""), template))
    left_alone = {pod for pod, _ in state.spec.left}
    left = tuple(LateLeft(str(x["pod"]), str(x["reason"])) for x in answer.left
                 if isinstance(x.get("pod"), str) and x["pod"] not in left_alone)
    starting = tuple(sorted(answer.starting))
    facts: JsonObject = {"command": answer.type}
    events = [PlanExtended(at=now, node=node, check=state.checks, children=tuple(joined),
                           left=left).recorded(facts)] if joined or left else []
    events.append(NodeRechecked(at=now, node=node, check=state.checks, joined=len(joined),
                                starting=starting).recorded(facts))
    return events


def _children_json(listed: JsonValue, where: str, node: str) -> list[JsonValue]:
    """Validated children ``[{pod, target, template, successor?}]`` (a spec's or a plan
    extension's); raises ``InvalidSpec`` naming the field."""
    listed = listed or []
    if not isinstance(listed, list):
        raise InvalidSpec(f"{where} must be a list of {{pod, target, template}}")
    children: list[JsonValue] = []
    seen: set[str] = set()
    for i, raw in enumerate(listed):
        field = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise InvalidSpec(f"{field} must be an object {{pod, target, template}}")
        only_known(raw, ("pod", "target", "template", "successor"), field=field)
        ref = pod_ref(raw.get("pod"), field=f"{field}.pod")
        target = node_name(raw.get("target"), field=f"{field}.target")
        if target == node:
            raise InvalidSpec(f"{field}.target {target!r} is the node being drained")
        if ref.uid in seen:
            raise InvalidSpec(f"{field}.pod lists pod uid {ref.uid} twice")
        seen.add(ref.uid)
        child: JsonObject = {"pod": ref.to_json(), "target": target,
                             "template": pod_template(raw.get("template"),
                                                      field=f"{field}.template")}
        successor = raw.get("successor")
        if successor is not None:
            if successor not in ("adopt", "gated"):
                raise InvalidSpec(f"{field}.successor {successor!r} is not 'adopt' (a "
                                  "ReplicaSet's pod) or 'gated' (a StatefulSet's); "
                                  "leave it out for a bare pod")
            child["successor"] = successor
        children.append(child)
    return children


def _late_pods_json(late: JsonValue, node: str) -> JsonObject:
    """``spec.late_pods``: ``{targets, selector}`` the plan was made with, so the pods
    found later are planned the same way."""
    if not isinstance(late, dict):
        raise InvalidSpec("spec.late_pods must be an object {targets, selector}")
    only_known(late, ("targets", "selector"), field="spec.late_pods")
    targets = late.get("targets") or []
    if not isinstance(targets, list):
        raise InvalidSpec("spec.late_pods.targets must be a list of node names")
    names: list[JsonValue] = []
    for i, t in enumerate(targets):
        name = node_name(t, field=f"spec.late_pods.targets[{i}]")
        if name == node:
            raise InvalidSpec(f"spec.late_pods.targets[{i}] {name!r} is the node being "
                              "drained")
        names.append(name)
    selector = late.get("selector")
    if selector is not None and not isinstance(selector, str):
        raise InvalidSpec("spec.late_pods.selector must be a label selector string")
    out: JsonObject = {"targets": names}
    if selector:
        out["selector"] = selector
    return out


def _list(spec: JsonObject, key: str) -> list[JsonValue]:
    value = spec.get(key)
    return value if isinstance(value, list) else []


def _finish(now: datetime, phase: DrainPhase, reason: str, message: str, state: DrainState,
            facts: JsonObject | None = None) -> Step:
    counts = state.counts()
    outcomes = tuple(ChildOutcome(child=c.id, pod=c.pod_key, target=c.target,
                                  status=c.status.value, phase=c.phase, reason=c.reason)
                     for c in state.children)
    return emit(DrainFinished(
        at=now, phase=phase.value, reason=reason, message=message,
        children=counts["children"], succeeded=counts["succeeded"], failed=counts["failed"],
        skipped=counts["skipped"], in_flight=counts["in_flight"],
        children_outcomes=outcomes,
    ).recorded(facts))


__all__ = ["KIND", "DrainDecider", "DrainPhase", "DrainState", "child_id"]
