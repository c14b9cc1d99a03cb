"""Append events and update the projection in ONE transaction, with an optimistic check.

A machine's ``version`` is the ``seq`` of its last event. A commit says which version it
read (``expected_version``) and, when a worker makes it, which lease it holds; the
projection UPDATE is guarded on both, and only if it matched are the events inserted at
``seq = version+1 ...``. A stale writer therefore gets :class:`ConcurrencyConflict` or
:class:`LeaseLost` and its transaction rolls back: never a silent overwrite. On SQLite the
unique ``(machine_id, seq)`` key is a second, independent guard; on partitioned
PostgreSQL (revision 0009) the key holds ``recorded_at`` too and refuses only a
same-instant duplicate, so the version check is the guard.

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
    LargeBinary,
    String,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.engine.decider import Action, Cause, Event
from controlplane.engine.events import Queued, Submitted
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
from controlplane.store.history_rows import event_rows_of, state_columns
from controlplane.store.records import (
    DecisionRecord,
    Lease,
    MachineRecord,
    Projection,
    RecordedEvent,
)
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
        events = [Submitted(kind=kind, spec=spec).recorded()]
        if held is not None:
            events.append(Queued(reason=held).recorded({"limit": held}))
        row = {"id": machine_id, "kind": kind, "phase": initial.phase,
               "version": len(events), "spec": spec, **state_columns(initial.state),
               "terminal": initial.terminal, "workload": workload,
               "source_node": source_node, "held": held is not None,
               "next_wake_at": None if initial.terminal or held is not None else now}
        keys = sorted(initial.wake_keys or ())
        event_rows = event_rows_of(machine_id, 1, events, now, worker_id,
                                   cause=Cause.ENGINE, decision_input={"submitted": True})
        try:
            if conn.dialect.name == "postgresql":
                await pg_batch.create_machine(conn, {**row, "now": now, "worker": worker_id},
                                              event_rows, keys)
                return
            await conn.execute(insert(m).values(
                **row, pending_actions=[], wake_seq=0, attempts=0, created_at=now,
                updated_at=now))
        except IntegrityError:
            raise _IdOrWorkloadTaken() from None
        await conn.execute(insert(schema.events), event_rows)
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
    cause: Cause
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
    # A machine may be in a batch twice (two of a worker's tasks decided it at once): one
    # statement for the batch would move its version once but report both as updated,
    # and on PostgreSQL the (machine_id, seq, recorded_at) key lets both append the same
    # seq. Only each machine's first request goes in the batch; a second is judged after
    # it, one by one, against the version the first left (so it is refused).
    firsts: dict[str, int] = {}
    for i, r in enumerate(requests):
        firsts.setdefault(r.machine_id, i)
    batch = [i for i, r in enumerate(requests) if r.lease is not None and firsts[r.machine_id] == i]
    updated: set[int] = set()  # indexes of the requests that moved their machine's version
    if conn.dialect.name == "postgresql" and len(batch) > 1:
        # One statement for the whole batch instead of one round trip per machine.
        ids = await _update_leased_batch_txn(conn, [requests[i] for i in batch])
        updated = {i for i in batch if requests[i].machine_id in ids}
    else:
        for i in batch:
            if await _commit_one_txn(conn, requests[i]):
                updated.add(i)
    for i, r in enumerate(requests):
        if i not in batch and await _commit_one_txn(conn, r):
            updated.add(i)
    outcomes: list[int | StaleWriter] = []
    accepted: list[CommitRequest] = []
    for i, r in enumerate(requests):
        if i in updated:
            accepted.append(r)
            outcomes.append(r.new_version)
        else:
            outcomes.append(await _explain_refusal_txn(conn, r))
    # Only guarded-in machines get events: a refused one leaves no trace in the batch.
    if accepted:
        event_rows = [row for r in accepted
                      for row in event_rows_of(r.machine_id, r.expected_version + 1, r.events,
                                               r.now, r.worker_id, cause=r.cause,
                                               decision_input=r.decision_input)]
        if conn.dialect.name == "postgresql":
            await pg_batch.insert_events(conn, event_rows)
        else:
            await conn.execute(insert(schema.events), event_rows)
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
    "state_z": bindparam("b_state_z", type_=LargeBinary),
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
         "phase": r.projection.phase, **state_columns(r.projection.state),
         "terminal": r.projection.terminal, "pending": [action_to_json(a) for a in r.outbox]}
        for r in requests
    ])


async def _commit_one_txn(conn: AsyncConnection, r: CommitRequest) -> bool:
    """One request's guarded update (lease and version, or version for a command)."""
    if r.lease is not None:
        params = {**_set_params(r), "b_token": r.lease.token, "b_now": r.now}
        return (await conn.execute(_COMMIT_LEASED, params)).rowcount == 1
    params = {**_set_params(r), "b_next_wake_at": None if r.projection.terminal else r.now}
    return (await conn.execute(_COMMIT_COMMAND, params)).rowcount == 1


def _set_params(r: CommitRequest) -> dict[str, Any]:
    state = state_columns(r.projection.state)
    return {
        "b_id": r.machine_id, "b_expected": r.expected_version, "b_version": r.new_version,
        "b_phase": r.projection.phase, "b_state": state["state"], "b_state_z": state["state_z"],
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
            version=version, phase=projection.phase, **state_columns(projection.state),
            terminal=projection.terminal, updated_at=now,
        )
    )
    if projection.wake_keys is not None:
        await _replace_keys_txn(conn, machine_id, projection.wake_keys)


async def restore_history_txn(conn: AsyncConnection, record: MachineRecord,
                              events: Sequence[RecordedEvent],
                              decisions: Sequence[DecisionRecord]) -> None:
    """Write back a machine's whole history as read from the store (``cpctl history
    import`` of an archive): its ``machines`` row and its events, in today's layout.

    A decision sits on the event it starts when it was decided at that event's time (as
    every decision the store records is); any other is written to ``decisions`` as the
    old layout had it. The events get new ``position`` values (appended to the global
    order now); their ``seq``, times and worker are kept. Raises ``IntegrityError`` if
    the machine or one of its events is already there.
    """
    by_seq = {d.first_seq: d for d in decisions}
    await conn.execute(insert(m).values(
        id=record.id, kind=record.kind, phase=record.phase, version=record.version,
        spec=record.spec, **state_columns(record.state), terminal=record.terminal,
        pending_actions=record.pending_actions, next_wake_at=record.next_wake_at,
        wake_seq=record.wake_seq, lease_owner=None, lease_token=None,
        lease_expires_at=None, attempts=record.attempts, created_at=record.created_at,
        updated_at=record.updated_at, workload=record.workload,
        source_node=record.source_node, held=record.held))
    rows: list[dict[str, Any]] = []
    legacy: list[DecisionRecord] = []
    for e in events:
        decision = by_seq.pop(e.seq, None)
        on_event = decision is not None and decision.decided_at == e.recorded_at
        [row] = event_rows_of(record.id, e.seq, [Event(e.type, e.data, e.facts)],
                              e.recorded_at, e.worker_id,
                              cause=decision.cause if decision else None,
                              decision_input=decision.input if decision else {})
        if not on_event:
            row.update(cause=None, input_z=None)
            if decision is not None:
                legacy.append(decision)
        rows.append(row)
    legacy.extend(by_seq.values())  # a decision past the last event: kept as it was
    if rows:
        await conn.execute(insert(schema.events), rows)
    if legacy:
        await conn.execute(insert(schema.decisions), [
            {"machine_id": record.id, "first_seq": d.first_seq, "cause": d.cause.value,
             "input": d.input, "decided_at": d.decided_at} for d in legacy])
