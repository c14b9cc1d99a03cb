"""The ``steps`` kind's typed events: recorded as the kind always recorded them, read back
as the same values, and an event type the kind does not record is refused, not ignored."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from controlplane.engine.decider import Event
from controlplane.engine.observation import Observation
from controlplane.machines.base.events import UnknownEvent
from controlplane.machines.selftest.events import (
    STEPS_EVENTS,
    Cancelled,
    GateArmed,
    GateOpened,
    GateTimedOut,
    StepCompleted,
)
from controlplane.machines.selftest.steps import StepsDecider, StepsPhase

D = StepsDecider()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_each_event_is_recorded_with_exactly_the_keys_histories_hold() -> None:
    recorded = [StepCompleted(step=2, payload="xx").recorded(),
                GateArmed(deadline=NOW).recorded(),
                GateOpened().recorded({"pod_uid": "u1", "pod_phase": "Running"}),
                GateTimedOut(reason="gate pod never ran").recorded({"deadline": "d"}),
                Cancelled(at_step=0).recorded()]
    assert [(e.type, json.dumps(e.data)) for e in recorded] == [
        ("StepCompleted", '{"step": 2, "payload": "xx"}'),
        ("GateArmed", '{"deadline": "2026-01-01T00:00:00+00:00"}'),
        ("GateOpened", "{}"),
        ("GateTimedOut", '{"reason": "gate pod never ran"}'),
        ("Cancelled", '{"at_step": 0}')]
    assert recorded[2].facts == {"pod_uid": "u1", "pod_phase": "Running"}
    for event in recorded:
        assert STEPS_EVENTS.decode(event).recorded(event.facts) == event


def test_the_decider_records_its_events_through_the_classes() -> None:
    state = D.initial_state("m", D.validate_spec({"steps": 1, "payload_bytes": 3}))
    [event] = D.decide(state, Observation(), NOW).events
    assert event == Event("StepCompleted", {"step": 1, "payload": "xxx"})
    assert D.evolve(state, event).status is StepsPhase.SUCCEEDED


def test_an_event_type_the_steps_kind_does_not_record_is_refused_not_ignored() -> None:
    """A renamed or misspelt event is an error when folded, even into a finished machine,
    instead of an ``evolve`` that silently returns the state unchanged."""
    live = D.initial_state("m", D.validate_spec({"steps": 2}))
    with pytest.raises(UnknownEvent, match="'StepDone' is not one this kind records"):
        D.evolve(live, Event("StepDone", {"step": 1, "payload": ""}))
    finished = D.evolve(live, Cancelled(at_step=0).recorded())
    assert finished.terminal
    with pytest.raises(UnknownEvent, match="'NodeCordoned' is not one this kind records"):
        D.evolve(finished, Event("NodeCordoned", {"at": NOW.isoformat(), "node": "n",
                                                  "already": False}))


def test_data_the_steps_kind_does_not_record_is_refused() -> None:
    live = D.initial_state("m", D.validate_spec({"steps": 2}))
    with pytest.raises(UnknownEvent, match="does not know: colour"):
        D.evolve(live, Event("StepCompleted", {"step": 1, "payload": "", "colour": "red"}))
