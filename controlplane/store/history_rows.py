"""How history is laid out in rows: the write side of the compact encoding (``codec``).

Since revision 0007 an event's facts are stored compressed (tiny ones stay plain JSON),
the decision record rides on the first event the decision appended (its cause and
compressed input; decided at the event's ``recorded_at``), and a machine's state is
stored compressed. The readers (``queries``, ``leases``, ``replay_reads``) take whichever
column holds a value, so rows written before 0007 read as they always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.engine.decider import Cause, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import codec


def state_columns(state: JsonObject) -> dict[str, Any]:
    """A projection's state as the ``machines`` columns store it (see ``store.codec``)."""
    plain, compressed = codec.column_pair(state)
    return {"state": plain, "state_z": compressed}


def event_rows_of(machine_id: str, first_seq: int, events: Sequence[Event], now: datetime,
                  worker_id: str, *, cause: Cause | None, decision_input: JsonObject,
                  ) -> list[dict[str, Any]]:
    """The ``events`` rows of one decision: its events at ``first_seq ...``, the first
    carrying the decision record (its cause and compressed input; decided at ``now``;
    ``cause`` None: no record).
    Facts are stored compressed unless they are tiny (``codec.column_pair``)."""
    # Cause(...) also refuses a cause no reader would know (a caller passing plain text).
    recorded_cause = None if cause is None else Cause(cause).value
    rows = []
    for i, e in enumerate(events):
        facts, facts_z = codec.column_pair(e.facts)
        rows.append({"machine_id": machine_id, "seq": first_seq + i, "type": e.type,
                     "data": e.data, "facts": facts, "facts_z": facts_z, "recorded_at": now,
                     "worker_id": worker_id,
                     "cause": recorded_cause if i == 0 else None,
                     "input_z": codec.encode(decision_input)
                     if i == 0 and cause is not None else None})
    return rows
