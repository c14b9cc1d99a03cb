"""Typed events travel as the ``(type, data)`` JSON histories were recorded in, and a kind
refuses an event it cannot read instead of folding it as a no-op."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from controlplane.engine.decider import Event
from controlplane.machines.base.events import (
    ENGINE_EVENTS,
    ActionFailed,
    DomainEvent,
    EventSet,
    UnknownEvent,
)

AT = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Sampled(DomainEvent):
    at: datetime
    count: int
    digest: str | None  # always written, null included
    size_bytes: int | None = None  # written only when known


@dataclass(frozen=True)
class OtherCancel(DomainEvent, name="CancelRequested"):
    before_deletion: bool = False


@dataclass(frozen=True)
class ThirdCancel(DomainEvent, name="CancelRequested"):
    pass


EVENTS = EventSet(ENGINE_EVENTS, [Sampled, OtherCancel])


def test_an_event_is_recorded_under_its_wire_name_with_the_facts_given() -> None:
    recorded = OtherCancel(before_deletion=True).recorded({"command": "Cancel"})
    assert recorded == Event("CancelRequested", {"before_deletion": True},
                             {"command": "Cancel"})


def test_an_optional_field_is_absent_while_unset_and_a_nullable_one_is_written() -> None:
    assert Sampled(AT, 3, None).data() == {"at": AT.isoformat(), "count": 3, "digest": None}
    assert Sampled(AT, 3, "sha256:a", 10).data() == {
        "at": AT.isoformat(), "count": 3, "digest": "sha256:a", "size_bytes": 10}


def test_decoding_a_recorded_event_gives_the_typed_event_back() -> None:
    event = Sampled(AT, 3, None, 10)
    assert EVENTS.decode(event.recorded()) == event
    assert EVENTS.decode(event) is event


def test_an_event_type_the_kind_does_not_record_is_an_error_not_a_no_op() -> None:
    with pytest.raises(UnknownEvent, match="'Sampeld' is not one this kind records"):
        EVENTS.decode(Event("Sampeld", {}))


def test_data_the_class_does_not_declare_is_refused_rather_than_dropped() -> None:
    with pytest.raises(UnknownEvent, match="does not know: colour"):
        EVENTS.decode(Event("Sampled", {"at": AT.isoformat(), "count": 1, "digest": None,
                                        "colour": "red"}))


def test_data_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(UnknownEvent, match="does not decode"):
        EVENTS.decode(Event("Sampled", {"at": "yesterday", "count": 1, "digest": None}))


def test_one_set_cannot_hold_two_classes_of_one_wire_name() -> None:
    with pytest.raises(ValueError, match="'CancelRequested' is both"):
        EventSet([OtherCancel, ThirdCancel])


def test_the_engines_action_failed_reads_as_the_worker_writes_it() -> None:
    data = {"at": AT.isoformat(), "action": "DeletePod", "key": "m/delete/1",
            "params": {"uid": "u"}, "error_class": "Forbidden", "message": "no",
            "retryable": False, "attempts": 1}
    failed = EVENTS.decode(Event("ActionFailed", data))
    assert isinstance(failed, ActionFailed)
    assert (failed.at, failed.action, failed.retryable) == (AT, "DeletePod", False)
    assert failed.data() == data
