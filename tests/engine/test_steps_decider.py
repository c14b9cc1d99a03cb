"""Given/when/then for every transition of the ``steps`` kind (pure, no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.engine.commands import RecordedCommand
from controlplane.engine.decider import CommandRejected, Event, InvalidSpec
from controlplane.engine.events import ActionFailed
from controlplane.engine.observation import Observation, PodView, ProbeError
from controlplane.machines.base.commands import Cancel, Retarget
from controlplane.machines.selftest.steps import StepsDecider, StepsPhase, StepsState

D = StepsDecider()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def given(spec: dict[str, object], *events: Event) -> StepsState:
    state = D.initial_state("m", D.validate_spec(spec))  # type: ignore[arg-type]
    for e in events:
        state = D.evolve(state, e)
    return state


GATE = {"steps": 2, "gate_pod": "ns/p", "gate_pod_uid": "u1", "deadline_seconds": 60}
ARMED = Event("GateArmed", {"deadline": (NOW + timedelta(seconds=60)).isoformat()})
STEP_1 = Event("StepCompleted", {"step": 1, "payload": ""})


def action_failed(key: str, message: str = "m") -> Event:
    return ActionFailed(at=NOW, action="steps.work", key=key, params={},
                        error_class="Forbidden", message=message, retryable=False,
                        attempts=1).recorded()


def test_running_machine_completes_the_next_step_with_its_action() -> None:
    decision = D.decide(given({"steps": 2}), Observation(), NOW)
    assert [e.type for e in decision.events] == ["StepCompleted"]
    assert decision.events[0].data["step"] == 1
    assert [(a.type, a.key) for a in decision.actions] == [("steps.work", "m:step:1")]


def test_the_last_step_makes_the_machine_succeed_and_terminal_is_absorbing() -> None:
    state = given({"steps": 1}, STEP_1)
    assert (state.status, state.terminal) == (StepsPhase.SUCCEEDED, True)
    assert D.decide(state, Observation(), NOW).idle
    assert D.evolve(state, action_failed("k")) == state


def test_a_gated_machine_arms_its_deadline_before_waiting() -> None:
    decision = D.decide(given(GATE), Observation(), NOW)
    assert decision.events == (ARMED,)


def test_a_gated_machine_opens_only_for_its_pod_uid_running() -> None:
    state = given(GATE, ARMED)
    running = PodView("ns", "p", "u1", "n1", "Running")
    assert [e.type for e in D.decide(state, Observation(pods={"ns/p": running}), NOW).events] \
        == ["GateOpened"]
    for pod in (PodView("ns", "p", "u2", "n1", "Running"), PodView("ns", "p", "u1", "n1",
                                                                   "Pending"), None,
                ProbeError("Unavailable", "500")):
        decision = D.decide(state, Observation(pods={"ns/p": pod}), NOW)
        assert decision.idle
        assert decision.wake_at == NOW + timedelta(seconds=60)


def test_the_gate_times_out_at_its_deadline_recording_the_probe_error() -> None:
    state = given(GATE, ARMED)
    later = NOW + timedelta(seconds=60)
    decision = D.decide(state, Observation(pods={"ns/p": ProbeError("Forbidden", "403")}), later)
    assert [e.type for e in decision.events] == ["GateTimedOut"]
    assert decision.events[0].facts["error_class"] == "Forbidden"
    assert D.evolve(state, decision.events[0]).status is StepsPhase.FAILED


def test_wake_keys_are_the_gate_pod_uid_only_while_waiting() -> None:
    assert given(GATE).wake_keys == {"u1"}
    assert given(GATE, ARMED, Event("GateOpened")).wake_keys == frozenset()


def test_cancel_is_accepted_while_live_and_refused_when_terminal() -> None:
    assert [e.type for e in D.accept(given({"steps": 2}), Cancel(), NOW)] == \
        ["Cancelled"]
    done = given({"steps": 1}, STEP_1)
    with pytest.raises(CommandRejected, match="already Succeeded"):
        D.accept(done, Cancel(), NOW)
    with pytest.raises(CommandRejected, match="steps machines accept only Cancel, not 'Retarget'"):
        D.accept(given({"steps": 2}), Retarget(node="n2"), NOW)
    with pytest.raises(CommandRejected, match="steps machines accept only Cancel, not 'Nudge'"):
        D.accept(given({"steps": 2}), RecordedCommand("Nudge"), NOW)


def test_an_action_failure_fails_the_machine_with_the_reason() -> None:
    state = D.evolve(given({"steps": 3}), action_failed("m:step:1", "403"))
    assert state.status is StepsPhase.FAILED
    assert "403" in state.reason


def test_state_round_trips_through_json() -> None:
    for state in (given(GATE), given(GATE, ARMED), given({"steps": 4},
                                                         STEP_1)):
        assert D.load_state(state.to_json()) == state


@pytest.mark.parametrize("spec", [{"steps": 0}, {"steps": True}, {"payload_bytes": -1},
                                  {"x": 1}, {"gate_pod": "a"}, {"deadline_seconds": 0}])
def test_invalid_specs_are_rejected_naming_the_field(spec: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.|unknown field"):
        D.validate_spec(spec)  # type: ignore[arg-type]
