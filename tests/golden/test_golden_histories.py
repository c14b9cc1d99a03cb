"""Checked-in histories pin the event format, and replaying them gives the recorded state."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from controlplane.app.replay import replay_machine, verify_machine
from controlplane.engine.decider import Cause
from controlplane.store.records import DecisionRecord, MachineRecord, RecordedEvent
from tests.golden.scenarios import golden_path, run_fresh
from tests.support.machines import KINDS


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(golden_path().read_text())
    return data


def _record(machine_id: str, final: dict[str, Any], when: datetime) -> MachineRecord:
    return MachineRecord(machine_id, "steps", final["phase"], final["version"], {},
                         final["state"], True, [], None, 0, None, None, 0, when, when)


def _events(machine_id: str, rows: list[dict[str, Any]]) -> list[RecordedEvent]:
    return [RecordedEvent(i, machine_id, r["seq"], r["type"], r["data"], r["facts"],
                          datetime.fromisoformat(r["recorded_at"]), r["worker_id"])
            for i, r in enumerate(rows)]


def _decisions(machine_id: str, rows: list[dict[str, Any]]) -> list[DecisionRecord]:
    return [DecisionRecord(machine_id, r["first_seq"], Cause(r["cause"]), r["input"],
                           datetime.fromisoformat(r["decided_at"])) for r in rows]


def test_todays_engine_records_exactly_the_golden_histories() -> None:
    """If this fails after an intended change, run `python -m tests.golden.scenarios`."""
    assert json.loads(json.dumps(run_fresh(), sort_keys=True)) == _load()


def test_folding_the_golden_events_gives_the_golden_final_state() -> None:
    for machine_id, golden in _load().items():
        events = _events(machine_id, golden["events"])
        record = _record(machine_id, golden["final"], events[0].recorded_at)
        state, version = replay_machine(KINDS, record, events)
        assert state.to_json() == golden["final"]["state"]
        assert (state.phase, version) == (golden["final"]["phase"], golden["final"]["version"])


def test_every_golden_decision_is_reproduced_by_todays_deciders() -> None:
    for machine_id, golden in _load().items():
        events = _events(machine_id, golden["events"])
        record = _record(machine_id, golden["final"], events[0].recorded_at)
        assert verify_machine(KINDS, record, events,
                              _decisions(machine_id, golden["decisions"])) == []
