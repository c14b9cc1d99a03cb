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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    String,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.engine.decider import QUEUED, SUBMITTED, Action, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import pg_batch, schema
from controlplane.store.admission import AdmissionFacts, admission_facts_txn, lock_admission_txn
from controlplane.store.database import Database
from controlplane.store.errors import (
    ConcurrencyConflict,
    LeaseLost,
    MachineExists,
    MachineNotFound,
    StaleWriter,
    WorkloadBusy,
)
from controlplane.store.records import Lease, Projection
from controlplane.store.session import read_txn, write_txn

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
    workload: str | None = None,
    source_node: str | None = None,
    admission: Callable[[AdmissionFacts], str | None] | None = None,
) -> None:
    """Insert a machine with its ``Submitted`` event (seq 1), due at once.

    ``workload`` claims that workload for this machine while it is live (a second live
    machine for it raises :class:`WorkloadBusy`, enforced by a unique index).
    ``admission`` is called with the :class:`AdmissionFacts` for this workload and source
    node (counted under the admission lock, in this transaction); it may raise to refuse,
    or return a reason to hold the machine in the admission queue: a ``Queued`` event
    (seq 2), not due until the admitter lets it in.
    """
    try:
        await _create_machine(db, machine_id=machine_id, kind=kind, spec=spec,
                              initial=initial, now=now, worker_id=worker_id,
                              workload=workload, source_node=source_node, admission=admission)
    except _IdOrWorkloadTaken:
        # Which one, asked after the failed transaction (the common path asks nothing:
        # a fresh id is the rule).
        async with read_txn(db) as conn:
            exists = await conn.scalar(select(m.c.id).where(m.c.id == machine_id))
        if exists is not None:
            raise MachineExists(f"machine {machine_id} already exists",
                                hint="use a new id") from None
        raise WorkloadBusy(
            f"workload {workload} already has a live operation",
            hint="wait for it to finish or cancel it (see `cpctl list --active`)",
        ) from None


class _IdOrWorkloadTaken(Exception):
    """A new machine's insert hit the primary key or the one-live-operation index."""


async def _create_machine(db: Database, *, machine_id: str, kind: str, spec: JsonObject,
                          initial: Projection, now: datetime, worker_id: str,
                          workload: str | None, source_node: str | None,
                          admission: Callable[[AdmissionFacts], str | None] | None) -> None:
    async with write_txn(db) as conn:
        held = None
        if admission is not None:
            await lock_admission_txn(conn)
            held = admission(await admission_facts_txn(conn, workload=workload,
                                                       source_node=source_node))
        events = [Event(SUBMITTED, {"kind": kind, "spec": spec})]
        if held is not None:
            events.append(Event(QUEUED, {"reason": held}, {"limit": held}))
        row = {"id": machine_id, "kind": kind, "phase": initial.phase,
               "version": len(events), "spec": spec, "state": initial.state,
               "terminal": initial.terminal, "workload": workload,
               "source_node": source_node, "held": held is not None,
               "next_wake_at": None if initial.terminal or held is not None else now}
        keys = sorted(initial.wake_keys or ())
        try:
            if conn.dialect.name == "postgresql":
                await pg_batch.create_machine(
                    conn, {**row, "now": now, "worker": worker_id},
                    _event_rows(machine_id, 1, events, now, worker_id),
                    {"cause": "engine", "input": {"submitted": True}}, keys)
                return
            await conn.execute(insert(m).values(
                **row, pending_actions=[], wake_seq=0, attempts=0, created_at=now,
                updated_at=now))
        except IntegrityError:
            raise _IdOrWorkloadTaken() from None
        await _insert_events_txn(conn, machine_id, 1, events, now, worker_id)
        await _insert_decision_txn(conn, machine_id, 1, "engine", {"submitted": True}, now)
        if keys:  # a new machine has no keys to replace
            await conn.execute(insert(schema.machine_keys),
                               [{"key": key, "machine_id": machine_id} for key in keys])


@dataclass(frozen=True)
class CommitRequest:
    """One machine's decision to persist: its events, new projection and outbox.

    ``outbox`` are the decision's actions, kept on the row until the lease is released
    (see ``schema.machines.pending_actions``). Without a ``lease`` (operator commands)
    the machine is also woken, so a worker decides on the new state promptly.
    """

    machine_id: str
    expected_version: int
    events: Sequence[Event]
    projection: Projection
    cause: str
    decision_input: JsonObject
    now: datetime
    worker_id: str
    lease: Lease | None = None
    outbox: Sequence[Action] = ()

    @property
    def new_version(self) -> int:
        return self.expected_version + len(self.events)


async def commit(db: Database, **fields: Any) -> int:
    """Commit one :class:`CommitRequest` (given as keywords); return the new version."""
    request = CommitRequest(**fields)
    async with write_txn(db) as conn:
        [outcome] = await commit_many_txn(conn, [request])
    if isinstance(outcome, StaleWriter):
        raise outcome
    return outcome


async def commit_many(db: Database, requests: Sequence[CommitRequest]) -> list[int | StaleWriter]:
    """Commit several machines' decisions in ONE transaction (one fsync for all).

    Each machine keeps its own guard: a stale one gets its :class:`StaleWriter` in the
    result list and writes nothing, the others commit. The worker's group committer
    calls this; with 32 machines in flight it turns 32 commits into one.
    """
    async with write_txn(db) as conn:
        return await commit_many_txn(conn, requests)


async def commit_many_txn(
    conn: AsyncConnection, requests: Sequence[CommitRequest]
) -> list[int | StaleWriter]:
    """:func:`commit_many` inside the caller's transaction."""
    if any(not r.events for r in requests):
        raise ValueError("a commit needs at least one event")
    leased = [r for r in requests if r.lease is not None]
    if conn.dialect.name == "postgresql" and len(leased) > 1:
        # One statement for the whole batch instead of one round trip per machine.
        updated = await _update_leased_batch_txn(conn, leased)
    else:
        updated = set()
        for r in leased:
            params = {**_set_params(r), "b_token": r.lease.token, "b_now": r.now}  # type: ignore[union-attr]
            if (await conn.execute(_COMMIT_LEASED, params)).rowcount == 1:
                updated.add(r.machine_id)
    for r in requests:
        if r.lease is None:
            params = {**_set_params(r),
                      "b_next_wake_at": None if r.projection.terminal else r.now}
            if (await conn.execute(_COMMIT_COMMAND, params)).rowcount == 1:
                updated.add(r.machine_id)
    outcomes: list[int | StaleWriter] = []
    accepted: list[CommitRequest] = []
    for r in requests:
        if r.machine_id in updated:
            accepted.append(r)
            outcomes.append(r.new_version)
        else:
            outcomes.append(await _explain_refusal_txn(conn, r))
    # Only guarded-in machines get events: a refused one leaves no trace in the batch.
    if accepted:
        event_rows = [row for r in accepted
                      for row in _event_rows(r.machine_id, r.expected_version + 1, r.events,
                                             r.now, r.worker_id)]
        decision_rows = [{"machine_id": r.machine_id, "first_seq": r.expected_version + 1,
                          "cause": r.cause, "input": r.decision_input, "decided_at": r.now}
                         for r in accepted]
        if conn.dialect.name == "postgresql":
            await pg_batch.insert_events(conn, event_rows)
            await pg_batch.insert_decisions(conn, decision_rows)
        else:
            await conn.execute(insert(schema.events), event_rows)
            await conn.execute(insert(schema.decisions), decision_rows)
        keys = {r.machine_id: r.projection.wake_keys for r in accepted
                if r.projection.wake_keys is not None}
        if conn.dialect.name == "postgresql":
            await pg_batch.replace_keys(conn, keys)
        else:
            for machine_id, machine_keys in keys.items():
                await _replace_keys_txn(conn, machine_id, machine_keys)
    return outcomes


# The two commit statements, built once (per-call construction dominated the worker's
# CPU). A worker's commit is guarded by version AND lease; an operator command's by
# version only, and it wakes the machine. Under a lease next_wake_at is left as it was
# (due): if the worker dies before releasing, the machine — even a terminal one — is
# claimable and its outbox performed; ``release`` clears it for terminal machines.
_SET: dict[str, Any] = {
    "version": bindparam("b_version", type_=Integer),
    "phase": bindparam("b_phase", type_=String),
    "state": bindparam("b_state", type_=schema.Json),
    "terminal": bindparam("b_terminal", type_=Boolean),
    "updated_at": bindparam("b_updated_at", type_=schema.UtcDateTime),
    "pending_actions": bindparam("b_pending", type_=schema.Json),
}
_SAME_VERSION = [m.c.id == bindparam("b_id"), m.c.version == bindparam("b_expected")]
_COMMIT_LEASED = update(m).where(
    *_SAME_VERSION, m.c.lease_token == bindparam("b_token"),
    m.c.lease_expires_at > bindparam("b_now", type_=schema.UtcDateTime),
).values(**_SET)
_COMMIT_COMMAND = update(m).where(*_SAME_VERSION).values(
    **_SET, wake_seq=m.c.wake_seq + 1,
    next_wake_at=bindparam("b_next_wake_at", type_=schema.UtcDateTime),
)


async def _update_leased_batch_txn(
    conn: AsyncConnection, requests: Sequence[CommitRequest]
) -> set[str]:
    """One constant statement for the whole batch (PostgreSQL, see ``pg_batch``)."""
    return await pg_batch.update_leased(conn, [
        {"id": r.machine_id, "expected": r.expected_version,
         "token": r.lease.token if r.lease else "", "now": r.now, "version": r.new_version,
         "phase": r.projection.phase, "state": r.projection.state,
         "terminal": r.projection.terminal, "pending": [action_to_json(a) for a in r.outbox]}
        for r in requests
    ])


def _set_params(r: CommitRequest) -> dict[str, Any]:
    return {
        "b_id": r.machine_id, "b_expected": r.expected_version, "b_version": r.new_version,
        "b_phase": r.projection.phase, "b_state": r.projection.state,
        "b_terminal": r.projection.terminal, "b_updated_at": r.now,
        "b_pending": [action_to_json(a) for a in r.outbox],
    }


def action_to_json(action: Action) -> JsonObject:
    return {"type": action.type, "key": action.key, "params": action.params}


def action_from_json(data: JsonObject) -> Action:
    params = data.get("params", {})
    assert isinstance(params, dict)
    return Action(str(data["type"]), str(data["key"]), params)


async def _explain_refusal_txn(conn: AsyncConnection, r: CommitRequest) -> StaleWriter:
    row = (
        await conn.execute(
            select(m.c.version, m.c.lease_token, m.c.lease_expires_at)
            .where(m.c.id == r.machine_id)
        )
    ).first()
    if row is None:
        raise MachineNotFound(f"no machine {r.machine_id}", hint="check the id with `cpctl list`")
    lease = r.lease
    if lease is not None and (row.lease_token != lease.token or row.lease_expires_at <= r.now):
        return LeaseLost(f"lease on machine {r.machine_id} expired or was taken over")
    return ConcurrencyConflict(
        f"machine {r.machine_id} is at version {row.version}, not {r.expected_version}",
        hint="decide again on fresh state",
    )


def _event_rows(machine_id: str, first_seq: int, events: Sequence[Event], now: datetime,
                worker_id: str) -> list[dict[str, Any]]:
    return [
        {"machine_id": machine_id, "seq": first_seq + i, "type": e.type, "data": e.data,
         "facts": e.facts, "recorded_at": now, "worker_id": worker_id}
        for i, e in enumerate(events)
    ]


async def _insert_events_txn(
    conn: AsyncConnection,
    machine_id: str,
    first_seq: int,
    events: Sequence[Event],
    now: datetime,
    worker_id: str,
) -> None:
    await conn.execute(insert(schema.events),
                       _event_rows(machine_id, first_seq, events, now, worker_id))


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
