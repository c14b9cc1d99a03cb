"""The ``drain`` machine, given/when/then: cordon observed before any child starts, at most
``max_parallel`` children in flight, deterministic child ids, children observed from the
store, cancel that never abandons a running child, and a node we did not cordon that we
never uncordon."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from controlplane.engine.decider import Event, InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import NodeView, Observation
from controlplane.machines.base.events import ActionFailed, UnknownEvent
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.drain.machine import (
    CHILDREN_RECHECK,
    DrainDecider,
    child_id,
)
from controlplane.machines.drain.state import machine_key, submit_key
from tests.machines.machines_gwt import REPO, TEMPLATE, Given, at, error
from tests.support.drain_gwt import DRAIN, NODE, child, seen, spec, view


def given(pods: int = 5, max_parallel: int = 2) -> Given:
    return Given(DrainDecider(), DRAIN, spec(pods, max_parallel))


def failed_for_good(action: ActionType, key: str, error_class: str, message: str,
                    when: datetime) -> Event:
    return ActionFailed(at=when, action=action, key=key, params={}, error_class=error_class,
                        message=message, retryable=False, attempts=1).recorded()


def draining(pods: int = 5, max_parallel: int = 2) -> Given:
    return given(pods, max_parallel).decided(seen(False), at(0)).decided(
        seen(True), at(1), until_idle=False)


def test_cordons_first_and_starts_no_child_until_the_node_is_seen_cordoned() -> None:
    then = given().when(seen(False), at(0)).then_events("Started", "CordonRequested")
    then.then_actions(ActionType.SET_NODE_UNSCHEDULABLE)
    assert then.action(ActionType.SET_NODE_UNSCHEDULABLE).params == {
        "node": NODE, "unschedulable": True}
    # The watch has not caught up: wait, do not re-issue, start nothing.
    then.and_then().when(seen(False), at(1)).then_idle().then_phase("Cordoning")
    then.and_then().when(seen(True), at(1)).then_events("NodeCordoned").then_phase("Draining")


def test_starts_at_most_max_parallel_children_with_deterministic_ids() -> None:
    then = draining().when(seen(True), at(2))
    then.then_events("ChildStarted", "ChildStarted").then_actions(ActionType.SUBMIT_OPERATION,
                                                                  ActionType.SUBMIT_OPERATION)
    assert [a.params["machine_id"] for a in then.actions] == [child(0), child(1)]
    assert [a.key for a in then.actions] == [submit_key(DRAIN, child(0)),
                                             submit_key(DRAIN, child(1))]
    submitted = then.actions[0].params["spec"]
    assert isinstance(submitted, dict)
    assert (submitted["source_node"], submitted["target_node"]) == (NODE, "node-c")
    # With two in flight (held by admission, or running), nothing more starts.
    nxt = then.and_then().when(seen(True, {child(0): view(0, "Checkpointing"),
                                           child(1): view(1)}), at(3))
    nxt.then_idle()
    assert nxt.decision.wake_at is not None


def test_children_in_flight_wake_the_drain_when_they_end_not_a_poll() -> None:
    """The drain indexes each in-flight child's machine key (the worker wakes it when the
    child ends); its own wake is only the 30 s safety re-check."""
    g = draining().decided(seen(True), at(2))
    nxt = g.when(seen(True, {child(0): view(0, "Checkpointing"), child(1): view(1)}), at(3))
    nxt.then_idle(wake_at=at(3) + CHILDREN_RECHECK)
    assert timedelta(seconds=30) <= CHILDREN_RECHECK
    assert nxt.state.wake_keys == {machine_key(child(0)), machine_key(child(1))}
    done = nxt.and_then().when(seen(True, {child(0): view(0, "Succeeded", True),
                                           child(1): view(1)}), at(4))
    assert machine_key(child(0)) not in done.state.wake_keys
    assert machine_key(child(1)) in done.state.wake_keys


def test_a_drain_that_keeps_names_asks_each_migration_to_keep_its_pods_name() -> None:
    raw = dict(spec(pods=1, max_parallel=1), keep_names=True)
    kept = Given(DrainDecider(), DRAIN, DrainDecider().validate_spec(raw))
    started = kept.decided(seen(False), at(0)).decided(seen(True), at(1), until_idle=False)
    submitted = started.when(seen(True), at(2)).action(ActionType.SUBMIT_OPERATION)
    assert submitted.params["spec"]["keep_name"] is True  # type: ignore[index]
    plain = draining(pods=1, max_parallel=1).when(seen(True), at(2))
    assert "keep_name" not in plain.action(ActionType.SUBMIT_OPERATION).params["spec"]  # type: ignore[operator]


def test_a_finished_child_frees_a_slot_for_the_next() -> None:
    g = draining().decided(seen(True), at(2))
    done = g.when(seen(True, {child(0): view(0, "Succeeded", True), child(1): view(1)}), at(5))
    done.then_events("ChildFinished")
    assert done.event("ChildFinished").data["phase"] == "Succeeded"
    after = done.and_then().when(seen(True, {child(1): view(1)}), at(5))
    after.then_events("ChildStarted")
    assert after.event("ChildStarted").data["child"] == child(2)


def test_a_probe_error_on_a_child_is_not_an_answer() -> None:
    g = draining().decided(seen(True), at(2))
    then = g.when(Observation(nodes={NODE: NodeView(NODE, True, True)},
                              machines={child(0): error(), child(1): error()}), at(3))
    then.then_idle()


def test_every_child_terminal_ends_the_drain_with_its_counts() -> None:
    g = draining(pods=2).decided(seen(True), at(2))
    g = g.decided(seen(True, {child(0): view(0, "Succeeded", True),
                              child(1): view(1, "RolledBack", True, "RestoreFailed")}), at(9))
    then = g.when(seen(True), at(10))
    then.then_phase("Failed")
    finished = next(e for e in then.history if e.type == "DrainFinished")
    assert (finished.data["succeeded"], finished.data["failed"]) == (1, 1)
    assert then.state.wake_keys == frozenset()


def test_all_children_succeeding_leaves_the_node_cordoned() -> None:
    g = draining(pods=1).decided(seen(True), at(2))
    then = g.when(seen(True, {child(0): view(0, "Succeeded", True)}), at(3))
    then.and_then().when(seen(True), at(3)).then_events("DrainFinished").then_phase(
        "Succeeded").then_no_action(ActionType.SET_NODE_UNSCHEDULABLE)


def test_a_refused_child_submission_counts_as_failed_and_others_go_on() -> None:
    g = draining(pods=3).decided(seen(True), at(2))
    refusal = failed_for_good(ActionType.SUBMIT_OPERATION, submit_key(DRAIN, child(0)),
                              "Refused", "pod gone", at(3))
    then = g.event(refusal).when(seen(True, {child(1): view(1)}), at(3))
    then.then_events("ChildStarted")
    assert then.state.counts()["failed"] == 1


def test_cancel_skips_pending_children_waits_for_running_ones_then_uncordons() -> None:
    g = draining(pods=5).decided(seen(True), at(2)).command("Cancel", at(3))
    running = {child(0): view(0), child(1): view(1)}
    then = g.when(seen(True, running), at(3)).then_events("ChildrenSkipped")
    g = then.and_then()
    g.when(seen(True, running), at(4)).then_idle()  # running children are not abandoned
    g = g.decided(seen(True, {child(0): view(0, "Succeeded", True),
                              child(1): view(1, "Succeeded", True)}), at(8))
    assert g.state.phase == "Uncordoning"
    uncordon = [e for e in g.history if e.type == "UncordonRequested"]
    assert len(uncordon) == 1
    g.when(seen(False), at(9)).then_events("NodeUncordoned", "DrainFinished").then_phase(
        "Cancelled")


def test_cancel_never_uncordons_a_node_that_was_cordoned_before_the_drain() -> None:
    g = given(pods=1).decided(seen(True), at(0), until_idle=False)
    assert [e.data.get("already") for e in g.history if e.type == "NodeCordoned"] == [True]
    then = g.command("Cancel", at(1)).when(seen(True), at(1))
    then.then_events("ChildrenSkipped")
    then.and_then().when(seen(True), at(1)).then_events("DrainFinished").then_phase(
        "Cancelled").then_no_action(ActionType.SET_NODE_UNSCHEDULABLE)


def test_a_cordon_forbidden_for_good_fails_the_drain() -> None:
    g = given().decided(seen(False), at(0))
    g = g.event(failed_for_good(ActionType.SET_NODE_UNSCHEDULABLE, f"{DRAIN}:cordon",
                                "Forbidden", "403", at(1)))
    g.when(seen(False), at(1)).then_events("DrainFinished").then_phase("Failed")


@pytest.mark.parametrize(("change", "fragment"), [
    ({"max_parallel": 0}, "max_parallel"),
    ({"node": "Bad_Node"}, "spec.node"),
    ({"children": [{"pod": {"namespace": "a", "name": "p", "uid": "u1"}, "target": NODE,
                    "template": TEMPLATE}]}, "is the node being drained"),
])
def test_bad_specs_are_refused_naming_the_field(change: JsonObject, fragment: str) -> None:
    raw: JsonObject = {"node": NODE, "class": {"repository": REPO}, **change}
    with pytest.raises(InvalidSpec, match=fragment):
        DrainDecider().validate_spec(raw)


def test_child_ids_depend_only_on_drain_and_pod() -> None:
    assert child_id(DRAIN, "uid-1") == child_id(DRAIN, "uid-1") != child_id(DRAIN, "uid-2")
    assert len(child_id("x" * 64, "uid")) <= 64


def test_a_started_child_whose_submission_never_ran_is_submitted_again() -> None:
    """Two children start in one step; the first is refused, and the runner stops there,
    so the second's SubmitOperation never ran. The store shows no such machine: the drain
    submits it again (same id and key) instead of waiting for it forever."""
    g = draining(pods=3).decided(seen(True), at(2))
    refusal = failed_for_good(ActionType.SUBMIT_OPERATION, submit_key(DRAIN, child(0)),
                              "Refused", "pod gone", at(3))
    g = g.event(refusal)
    then = g.when(seen(True, {child(1): None}), at(3))
    assert then.decision.events == ()  # nothing new happened: the same child, again
    assert [(a.type, a.key, a.params["machine_id"]) for a in then.actions] == [
        (ActionType.SUBMIT_OPERATION, submit_key(DRAIN, child(1)), child(1))]
    # Once the store has it, it is not submitted again; the freed slot goes to child 2.
    nxt = g.when(seen(True, {child(1): view(1)}), at(4)).then_events("ChildStarted")
    assert [a.params["machine_id"] for a in nxt.actions] == [child(2)]


def test_an_event_type_the_drain_does_not_record_is_refused_not_ignored() -> None:
    """A renamed or misspelt event is an error when folded, even into a finished drain,
    instead of an ``evolve`` that silently returns the state unchanged."""
    live = draining().state
    with pytest.raises(UnknownEvent, match="'ChildStartd' is not one this kind records"):
        DrainDecider().evolve(live, Event("ChildStartd", {"at": at(2).isoformat(),
                                                          "child": child(0)}))
    g = draining(pods=0)
    finished = g.when(seen(True), at(2)).then_phase("Succeeded").state
    with pytest.raises(UnknownEvent, match="'StepCompleted' is not one this kind records"):
        DrainDecider().evolve(finished, Event("StepCompleted", {"step": 1}))
