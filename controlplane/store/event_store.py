"""Append events and update the projection in ONE transaction, with an optimistic check.

A machine's ``version`` is the ``seq`` of its last event. A commit says which version it
read (``expected_version``) and, when a worker makes it, which lease it holds; the
projection UPDATE is guarded on both, and only if it matched are the events inserted at
``seq = version+1 ...``. A stale writer therefore gets :class:`ConcurrencyConflict` or
:class:`LeaseLost` and its transaction rolls back: never a silent overwrite. The unique
``(machine_id, seq)`` key is a second, independent guard.

Callers: the worker runtime (decisions), the submission path (``create_machine``,
commands), replay (``rewrite_projection_txn``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.engine.decider import SUBMITTED, Action, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import schema
from controlplane.store.database import Database
from controlplane.store.errors import (
    ConcurrencyConflict,
    LeaseLost,
    MachineExists,
    MachineNotFound,
)
from controlplane.store.records import Lease, Projection
from controlplane.store.session import write_txn

m = schema.machines


async def create_machine(
    db: Database,
    *,
    machine_id: str,
    kind: str,
    spec: JsonObject,
    initial: Projection,
    now: datetime,
    worker_id: str,
) -> None:
    """Insert a machine with its ``Submitted`` event (seq 1), due at once."""
    async with write_txn(db) as conn:
        exists = await conn.scalar(select(m.c.id).where(m.c.id == machine_id))
        if exists is not None:
            raise MachineExists(f"machine {machine_id} already exists", hint="use a new id")
        await conn.execute(
            insert(m).values(
                id=machine_id, kind=kind, phase=initial.phase, version=1, spec=spec,
                state=initial.state, terminal=initial.terminal, pending_actions=[],
                next_wake_at=None if initial.terminal else now, wake_seq=0, attempts=0,
                created_at=now, updated_at=now,
            )
        )
        submitted = Event(SUBMITTED, {"kind": kind, "spec": spec})
        await _insert_events_txn(conn, machine_id, 1, [submitted], now, worker_id)
        await _insert_decision_txn(conn, machine_id, 1, "engine", {"submitted": True}, now)
        await _replace_keys_txn(conn, machine_id, initial.wake_keys or frozenset())


async def commit(
    db: Database,
    *,
    machine_id: str,
    expected_version: int,
    events: Sequence[Event],
    projection: Projection,
    cause: str,
    decision_input: JsonObject,
    now: datetime,
    worker_id: str,
    lease: Lease | None = None,
    outbox: Sequence[Action] = (),
) -> int:
    """Append ``events`` and write ``projection``; return the new version.

    ``outbox`` are the decision's actions, kept on the row until the lease is released
    (see ``schema.machines.pending_actions``).

    Without a lease (operator commands), the machine is also woken so a worker decides on
    the new state promptly, even if another worker holds it right now.
    """
    async with write_txn(db) as conn:
        return await commit_txn(
            conn, machine_id=machine_id, expected_version=expected_version, events=events,
            projection=projection, cause=cause, decision_input=decision_input, now=now,
            worker_id=worker_id, lease=lease, outbox=outbox,
        )


async def commit_txn(
    conn: AsyncConnection,
    *,
    machine_id: str,
    expected_version: int,
    events: Sequence[Event],
    projection: Projection,
    cause: str,
    decision_input: JsonObject,
    now: datetime,
    worker_id: str,
    lease: Lease | None,
    outbox: Sequence[Action] = (),
) -> int:
    """:func:`commit` inside the caller's transaction."""
    if not events:
        raise ValueError("a commit needs at least one event")
    new_version = expected_version + len(events)
    values: dict[str, Any] = {
        "version": new_version, "phase": projection.phase, "state": projection.state,
        "terminal": projection.terminal, "updated_at": now,
        "pending_actions": [action_to_json(a) for a in outbox],
    }
    guard = [m.c.id == machine_id, m.c.version == expected_version]
    if lease is not None:
        guard += [m.c.lease_token == lease.token, m.c.lease_expires_at > now]
    else:
        values["wake_seq"] = m.c.wake_seq + 1
        values["next_wake_at"] = None if projection.terminal else now
    if projection.terminal:
        values["next_wake_at"] = None
    result = await conn.execute(update(m).where(*guard).values(**values))
    if result.rowcount != 1:
        await _explain_refusal_txn(conn, machine_id, expected_version, lease, now)
    await _insert_events_txn(conn, machine_id, expected_version + 1, events, now, worker_id)
    await _insert_decision_txn(conn, machine_id, expected_version + 1, cause, decision_input, now)
    if projection.wake_keys is not None:
        await _replace_keys_txn(conn, machine_id, projection.wake_keys)
    return new_version


def action_to_json(action: Action) -> JsonObject:
    return {"type": action.type, "key": action.key, "params": action.params}


def action_from_json(data: JsonObject) -> Action:
    params = data.get("params", {})
    assert isinstance(params, dict)
    return Action(str(data["type"]), str(data["key"]), params)


async def _explain_refusal_txn(
    conn: AsyncConnection, machine_id: str, expected: int, lease: Lease | None, now: datetime
) -> None:
    row = (
        await conn.execute(
            select(m.c.version, m.c.lease_token, m.c.lease_expires_at).where(m.c.id == machine_id)
        )
    ).first()
    if row is None:
        raise MachineNotFound(f"no machine {machine_id}", hint="check the id with `cpctl list`")
    if lease is not None and (row.lease_token != lease.token or row.lease_expires_at <= now):
        raise LeaseLost(f"lease on machine {machine_id} expired or was taken over")
    raise ConcurrencyConflict(
        f"machine {machine_id} is at version {row.version}, not {expected}",
        hint="decide again on fresh state",
    )


async def _insert_events_txn(
    conn: AsyncConnection,
    machine_id: str,
    first_seq: int,
    events: Sequence[Event],
    now: datetime,
    worker_id: str,
) -> None:
    await conn.execute(
        insert(schema.events),
        [
            {
                "machine_id": machine_id, "seq": first_seq + i, "type": e.type,
                "data": e.data, "facts": e.facts, "recorded_at": now, "worker_id": worker_id,
            }
            for i, e in enumerate(events)
        ],
    )


async def _insert_decision_txn(
    conn: AsyncConnection,
    machine_id: str,
    first_seq: int,
    cause: str,
    decision_input: JsonObject,
    now: datetime,
) -> None:
    await conn.execute(
        insert(schema.decisions).values(
            machine_id=machine_id, first_seq=first_seq, cause=cause, input=decision_input,
            decided_at=now,
        )
    )


async def _replace_keys_txn(conn: AsyncConnection, machine_id: str, keys: frozenset[str]) -> None:
    k = schema.machine_keys
    await conn.execute(delete(k).where(k.c.machine_id == machine_id))
    if keys:
        rows = [{"key": key, "machine_id": machine_id} for key in sorted(keys)]
        await conn.execute(insert(k), rows)


async def rewrite_projection_txn(
    conn: AsyncConnection, *, machine_id: str, version: int, projection: Projection, now: datetime
) -> None:
    """Replay's write: set the projection rebuilt from events (keeps lease and schedule)."""
    await conn.execute(
        update(m)
        .where(m.c.id == machine_id)
        .values(
            version=version, phase=projection.phase, state=projection.state,
            terminal=projection.terminal, updated_at=now,
        )
    )
    if projection.wake_keys is not None:
        await _replace_keys_txn(conn, machine_id, projection.wake_keys)
