"""The drain moves pods that reached its node after the plan (spec ``late_pods``): once
every child settled it asks for the node's pods again, a new pod joins the plan
(``PlanExtended``) and is moved and counted like the planned ones, and the drain ends
only after an answer adds nothing and finds nothing still starting. Drains recorded
without ``late_pods`` never ask, so their recorded decisions replay the same."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.engine.decider import CommandRejected
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.machine import (
    CHECK_ANSWER_WITHIN,
    CHECK_NODE_PODS,
    NODE_PODS_LISTED,
    STARTING_GRACE,
    STARTING_RECHECK,
    DrainDecider,
    child_id,
)
from tests.machines.machines_gwt import TEMPLATE, Given, at
from tests.support.drain_gwt import DRAIN, NODE, child, seen, spec, view


def late_spec(pods: int = 1, **late: Any) -> JsonObject:
    return DrainDecider().validate_spec(dict(spec(pods, max_parallel=2), late_pods=late))


def settled(pods: int = 1) -> Given:
    """A late_pods drain whose planned children all succeeded (at t=5)."""
    g = Given(DrainDecider(), DRAIN, late_spec(pods))
    g = g.decided(seen(False), at(0)).decided(seen(True), at(1)).decided(seen(True), at(2))
    return g.decided(seen(True, {child(i): view(i, "Succeeded", True) for i in range(pods)}),
                     at(5), until_idle=False)


def late(name: str, uid: str, target: str = "node-b") -> JsonObject:
    return {"pod": {"namespace": "apps", "name": name, "uid": uid}, "target": target,
            "template": TEMPLATE}


def test_a_settled_drain_asks_for_its_nodes_pods_before_it_ends() -> None:
    then = settled().when(seen(True), at(6))
    then.then_events("NodeRecheckRequested").then_actions(CHECK_NODE_PODS).then_phase(
        "Draining")
    assert then.action(CHECK_NODE_PODS).params == {"drain": DRAIN, "node": NODE, "check": 1}
    # Unanswered: it waits (the answer wakes it), and asks again when none came.
    waiting = then.and_then().when(seen(True), at(7))
    waiting.then_idle(wake_at=at(6) + CHECK_ANSWER_WITHIN)
    again = then.and_then().when(seen(True), at(6) + CHECK_ANSWER_WITHIN)
    again.then_events("NodeRecheckRequested")
    assert again.action(CHECK_NODE_PODS).params["check"] == 2


def test_a_pod_found_after_the_plan_is_moved_and_counted_like_the_planned_ones() -> None:
    asked = settled().decided(seen(True), at(6), until_idle=False)
    answer = asked.when_command(NODE_PODS_LISTED, at(7), check=1,
                                children=[late("late-1", "uid-late")],
                                left=[{"pod": "apps/ds-2", "reason": "DaemonSet pod"}],
                                starting=[])
    answer.then_events("PlanExtended", "NodeRechecked")
    extended = answer.event("PlanExtended").data
    assert [c["child"] for c in extended["children"]] == [child_id(DRAIN, "uid-late")]
    state = answer.state
    assert [c.pod_key for c in state.children] == ["apps/p0", "apps/late-1"]
    assert state.children[1].joined_at == at(7)
    assert ("apps/ds-2", "DaemonSet pod") in state.spec.left
    assert [(e.at, e.joined, e.left) for e in state.extensions] == [
        (at(7), ("apps/late-1",), ("apps/ds-2",))]

    start = answer.and_then().when(seen(True), at(8))
    start.then_events("ChildStarted").then_actions(ActionType.SUBMIT_OPERATION)
    submitted = start.action(ActionType.SUBMIT_OPERATION).params
    assert submitted["machine_id"] == child_id(DRAIN, "uid-late")
    assert submitted["spec"]["pod"]["uid"] == "uid-late"  # type: ignore[index,call-overload]
    assert start.state.counts()["in_flight"] == 1

    moved = start.and_then().decided(
        seen(True, {child_id(DRAIN, "uid-late"): view(0, "Succeeded", True)}), at(20),
        until_idle=False)
    # Its child settled: it asks once more, and only a clean answer ends it.
    ask = moved.when(seen(True), at(21)).then_events("NodeRecheckRequested")
    clean = ask.and_then().command(NODE_PODS_LISTED, at(22), check=2, children=[], left=[],
                                   starting=[])
    end = clean.when(seen(True), at(23)).then_events("DrainFinished").then_phase("Succeeded")
    finished = end.event("DrainFinished").data
    assert (finished["children"], finished["succeeded"]) == (2, 2)
    assert "(1 found after the plan)" in str(finished["message"])


def test_a_pod_still_starting_on_the_node_holds_the_drain_then_fails_it() -> None:
    asked = settled().decided(seen(True), at(6), until_idle=False)
    g = asked.command(NODE_PODS_LISTED, at(7), check=1, children=[], left=[],
                      starting=["apps/booting"])
    then = g.when(seen(True), at(7))
    then.then_idle(wake_at=at(6) + STARTING_RECHECK)
    g.when(seen(True), at(6) + STARTING_RECHECK).then_events("NodeRecheckRequested")
    # Still starting at every look, for longer than the grace: Failed, never Succeeded.
    last = at(7) + STARTING_GRACE
    g = g.decided(seen(True), last - STARTING_RECHECK, until_idle=False)
    g = g.command(NODE_PODS_LISTED, last, check=2, children=[], left=[],
                  starting=["apps/booting"])
    end = g.when(seen(True), last).then_phase("Failed")
    assert end.event("DrainFinished").data["reason"] == "LatePodsNotRunning"


def test_answers_add_no_pod_twice_and_stale_or_cancelled_answers_add_nothing() -> None:
    asked = settled(pods=2).decided(seen(True), at(6), until_idle=False)
    planned = {"pod": {"namespace": "apps", "name": "p1", "uid": "uid-1"},
               "target": "node-b", "template": TEMPLATE}
    known = asked.when_command(NODE_PODS_LISTED, at(7), check=1, children=[planned],
                               left=[{"pod": "apps/ds", "reason": "DaemonSet pod"}],
                               starting=[])
    known.then_events("NodeRechecked")  # p1 is in the plan, apps/ds already left alone
    assert known.event("NodeRechecked").data["joined"] == 0
    asked.when_command(NODE_PODS_LISTED, at(7), check=7, children=[late("x", "u-x")],
                       left=[], starting=[]).then_events()
    with pytest.raises(CommandRejected, match="node being drained"):
        asked.when_command(NODE_PODS_LISTED, at(7), check=1,
                           children=[late("x", "u-x", target=NODE)], left=[], starting=[])
    cancelled = asked.command("Cancel", at(7))
    cancelled.when_command(NODE_PODS_LISTED, at(8), check=1, children=[late("x", "u-x")],
                           left=[], starting=[]).then_events()


def test_a_drain_recorded_without_late_pods_ends_without_asking() -> None:
    g = Given(DrainDecider(), DRAIN, spec(1, max_parallel=2))
    g = g.decided(seen(False), at(0)).decided(seen(True), at(1)).decided(seen(True), at(2))
    g = g.decided(seen(True, {child(0): view(0, "Succeeded", True)}), at(5), until_idle=False)
    g.when(seen(True), at(6)).then_events("DrainFinished").then_no_action(CHECK_NODE_PODS)
    assert "late_pods" not in g.state.to_json()["spec"]


def test_late_pods_keeps_the_plans_targets_and_selector() -> None:
    state = DrainDecider().initial_state(DRAIN, late_spec(targets=["node-b"],
                                                          selector="app=web"))
    assert (state.spec.late_pods, state.spec.targets, state.spec.selector) == (
        True, ("node-b",), "app=web")
    with pytest.raises(Exception, match="node being drained"):
        late_spec(targets=[NODE])
