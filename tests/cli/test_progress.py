"""What an operation waits for (``--wait``, and the API's ``waiting_for``), from its
projection alone."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from controlplane.app.waiting import WAITING_FOR, waiting_for
from controlplane.store.records import MachineRecord

T0 = datetime(2026, 11, 22, tzinfo=UTC)
RECORD = MachineRecord(id="m", kind="migration", phase="Restoring", version=7, spec={},
                       state={}, terminal=False, pending_actions=[], next_wake_at=None,
                       wake_seq=0, lease_owner=None, lease_expires_at=None, attempts=0,
                       created_at=T0, updated_at=T0)


def test_a_running_phase_names_what_it_waits_for() -> None:
    assert waiting_for(RECORD) == WAITING_FOR["Restoring"]
    assert "restored pod" in waiting_for(RECORD)


def test_a_held_operation_waits_for_its_turn_in_the_admission_queue() -> None:
    assert "admission queue" in waiting_for(replace(RECORD, held=True))


def test_committed_actions_not_yet_performed_are_named() -> None:
    record = replace(RECORD, pending_actions=[{"type": "DeletePod", "key": "k", "params": {}},
                                              {"type": "EmitEvent", "key": "e", "params": {}}])
    assert waiting_for(record) == "a worker to perform DeletePod, EmitEvent"


def test_a_terminal_operation_waits_only_for_its_last_actions_or_its_lease() -> None:
    done = replace(RECORD, phase="Succeeded", terminal=True)
    assert waiting_for(done) == "its worker to let go of it"
    assert waiting_for(replace(done, pending_actions=[{"type": "EmitEvent"}])) == \
        "its last actions to be performed"


def test_an_unknown_phase_still_gets_a_sentence() -> None:
    assert waiting_for(replace(RECORD, phase="SomethingNew")) == "its next observation"
