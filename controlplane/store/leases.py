"""Leases: workers claim due machines, keep them alive, and let them go.

Claiming is one statement, as in River: pick due, unleased (or lease-expired) machines
``ORDER BY next_wake_at LIMIT n`` — on PostgreSQL ``FOR UPDATE SKIP LOCKED`` so concurrent
workers never block on or double-claim a row — and ``UPDATE ... RETURNING`` them with a
fresh lease token. An expired lease is simply claimable again: there is no separate
rescuer, and the token fences the old owner's commits (see ``event_store.commit``).

Time is always the caller's ``now`` (an injectable clock), never the database's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Integer,
    Row,
    and_,
    bindparam,
    case,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.store import codec, pg_batch, schema
from controlplane.store.database import Database
from controlplane.store.errors import LeaseLost
from controlplane.store.records import Claimed, Lease, MachineRecord
from controlplane.store.schema import UtcDateTime
from controlplane.store.session import write_txn

m = schema.machines


def row_to_record(row: Row[tuple[object, ...]]) -> MachineRecord:
    r = row._mapping
    return MachineRecord(
        id=r["id"], kind=r["kind"], phase=r["phase"], version=r["version"], spec=r["spec"],
        state=codec.from_columns(r["state"], r["state_z"]), terminal=r["terminal"],
        pending_actions=r["pending_actions"],
        next_wake_at=r["next_wake_at"],
        wake_seq=r["wake_seq"], lease_owner=r["lease_owner"],
        lease_expires_at=r["lease_expires_at"], attempts=r["attempts"],
        created_at=r["created_at"], updated_at=r["updated_at"], workload=r["workload"],
        source_node=r["source_node"], held=r["held"],
    )


def _due(now: datetime) -> list[ColumnElement[bool]]:
    # Not filtered on ``terminal``: a terminal machine whose worker died before releasing
    # it still has its wake time set, so its outbox (pending actions) gets performed.
    return [
        m.c.next_wake_at <= now,
        or_(m.c.lease_expires_at.is_(None), m.c.lease_expires_at <= now),
    ]


async def claim_due(
    db: Database,
    *,
    owner: str,
    token: str,
    now: datetime,
    limit: int,
    lease_seconds: float,
    kinds: Sequence[str] | None = None,
    exclude: Collection[str] = (),
) -> list[Claimed]:
    """Lease up to ``limit`` due machines to ``owner`` under ``token``; oldest wake first.

    ``exclude``: machines this worker left to a newer one (:func:`leave`); they stay due
    for the others and never fill this worker's claims.
    """
    expires = now + timedelta(seconds=lease_seconds)
    pick = select(m.c.id).where(*_due(now)).order_by(m.c.next_wake_at).limit(limit)
    if kinds is not None:
        pick = pick.where(m.c.kind.in_(list(kinds)))
    if exclude:
        pick = pick.where(m.c.id.not_in(sorted(exclude)))
    if db.backend == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    stmt = (
        update(m)
        .where(m.c.id.in_(pick.scalar_subquery()))
        .values(lease_owner=owner, lease_token=token, lease_expires_at=expires,
                attempts=m.c.attempts + 1)
        .returning(*m.c)
    )
    async with write_txn(db) as conn:
        rows = (await conn.execute(stmt)).all()
    claimed = []
    for row in rows:
        record = row_to_record(row)
        lease = Lease(record.id, owner, token, expires, record.wake_seq)
        claimed.append(Claimed(record, lease))
    claimed.sort(key=lambda c: (c.record.next_wake_at, c.record.id))
    return claimed


async def heartbeat(
    db: Database, *, owner: str, token: str, now: datetime, lease_seconds: float
) -> int:
    """Extend the live leases of one claim batch; return how many it extended.

    It never waits for a row lock: rows locked right now (this worker committing that
    machine, or a wake) are skipped (``SKIP LOCKED``) and extended by the next heartbeat,
    a third of a lease later. Waiting for them, in whatever order the rows come, could
    deadlock with the worker's own group commit (seen by the scale benchmark on
    PostgreSQL: the heartbeat loop died and every lease of the worker expired).
    """
    mine = (select(m.c.id)
            .where(m.c.lease_token == token, m.c.lease_owner == owner,
                   m.c.lease_expires_at > now)
            .with_for_update(skip_locked=True))
    stmt = (
        update(m)
        .where(m.c.id.in_(mine.scalar_subquery()), m.c.lease_token == token)
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    async with write_txn(db) as conn:
        result = await conn.execute(stmt)
    return int(result.rowcount)


@dataclass(frozen=True)
class ReleaseRequest:
    """Give ``lease``'s machine back, due at ``wake_at`` (see :func:`release`)."""

    lease: Lease
    now: datetime
    wake_at: datetime | None
    reset_attempts: bool = True


# Built once: per-call statement construction was the worker's top CPU cost.
_RELEASE = (
    update(m)
    .where(m.c.id == bindparam("b_id"), m.c.lease_token == bindparam("b_token"))
    .values(
        lease_owner=None, lease_token=None, lease_expires_at=None, pending_actions=[],
        next_wake_at=case(
            (m.c.terminal.is_(True), None),
            (m.c.wake_seq != bindparam("b_wake_seq", type_=Integer),
             bindparam("b_now", type_=UtcDateTime)),
            else_=bindparam("b_wake_at", type_=UtcDateTime),
        ),
        attempts=case((bindparam("b_reset", type_=Boolean), 0), else_=m.c.attempts),
    )
)


async def release(
    db: Database, *, lease: Lease, now: datetime, wake_at: datetime | None, reset_attempts: bool
) -> None:
    """Give the machine back, due at ``wake_at`` (None: only an external wake).

    If a wake arrived while we held it (``wake_seq`` moved), it is due now instead: a pod
    event seen mid-decision must not be slept through.
    """
    async with write_txn(db) as conn:
        await release_txn(conn, lease=lease, now=now, wake_at=wake_at,
                          reset_attempts=reset_attempts)


async def release_txn(
    conn: AsyncConnection,
    *,
    lease: Lease,
    now: datetime,
    wake_at: datetime | None,
    reset_attempts: bool,
) -> None:
    [outcome] = await release_many_txn(conn, [ReleaseRequest(lease, now, wake_at,
                                                             reset_attempts)])
    if outcome is not None:
        raise outcome


async def release_many_txn(
    conn: AsyncConnection, requests: Sequence[ReleaseRequest]
) -> list[LeaseLost | None]:
    """Release several machines in the caller's transaction; a lost lease is returned."""
    if conn.dialect.name == "postgresql" and len(requests) > 1:
        released = await _release_batch_txn(conn, requests)
    else:
        released = set()
        for r in requests:
            result = await conn.execute(_RELEASE, {
                "b_id": r.lease.machine_id, "b_token": r.lease.token,
                "b_wake_seq": r.lease.wake_seq, "b_now": r.now, "b_wake_at": r.wake_at,
                "b_reset": r.reset_attempts,
            })
            if result.rowcount == 1:
                released.add(r.lease.machine_id)
    return [None if r.lease.machine_id in released else LeaseLost(
        f"lease on machine {r.lease.machine_id} was taken over before release")
        for r in requests]


async def _release_batch_txn(
    conn: AsyncConnection, requests: Sequence[ReleaseRequest]
) -> set[str]:
    """One constant statement for a batch of releases (PostgreSQL, see ``pg_batch``)."""
    return await pg_batch.release(conn, [
        {"id": r.lease.machine_id, "token": r.lease.token, "wake_seq": r.lease.wake_seq,
         "now": r.now, "wake_at": r.wake_at, "reset": r.reset_attempts}
        for r in requests
    ])


async def leave(db: Database, *, lease: Lease, now: datetime) -> None:
    """Give a machine back untouched, due now, for a worker that can read it.

    Unlike :func:`release` it keeps the outbox (``pending_actions``: actions this worker
    may not know) and the claim count, and ignores ``wake_seq``: the machine is due at
    once either way. Fenced by the lease token like every write of a lease holder.
    """
    stmt = (update(m)
            .where(m.c.id == lease.machine_id, m.c.lease_token == lease.token)
            .values(lease_owner=None, lease_token=None, lease_expires_at=None,
                    next_wake_at=now))
    async with write_txn(db) as conn:
        result = await conn.execute(stmt)
    if result.rowcount != 1:
        raise LeaseLost(f"lease on machine {lease.machine_id} was taken over before it was left")


async def wake_by_key(db: Database, *, key: str, now: datetime) -> int:
    """Make every live machine that indexed ``key`` (e.g. a pod UID) due now."""
    k = schema.machine_keys
    interested = select(k.c.machine_id).where(k.c.key == key).scalar_subquery()
    return await _wake(db, m.c.id.in_(interested), now)


async def wake_by_keys(db: Database, *, keys: Sequence[str], now: datetime) -> int:
    """:func:`wake_by_key` for many keys in one transaction (a burst of pod changes)."""
    if not keys:
        return 0
    k = schema.machine_keys
    interested = select(k.c.machine_id).where(k.c.key.in_(sorted(set(keys))))
    return await _wake(db, m.c.id.in_(interested.scalar_subquery()), now)


async def wake_machine(db: Database, *, machine_id: str, now: datetime) -> int:
    """Make one machine due now (e.g. after an operator command)."""
    return await _wake(db, m.c.id == machine_id, now)


async def _wake(db: Database, which: ColumnElement[bool], now: datetime) -> int:
    sooner = case(
        (or_(m.c.next_wake_at.is_(None), m.c.next_wake_at > now), now), else_=m.c.next_wake_at
    )
    # Lock the rows in id order first (as group commits do, store.batch): a wake of many
    # machines must not deadlock with a worker's group transaction.
    in_order = (select(m.c.id).where(and_(which, m.c.terminal.is_(False)))
                .order_by(m.c.id).with_for_update())
    stmt = (
        update(m)
        .where(m.c.id.in_(in_order.scalar_subquery()))
        .values(next_wake_at=sooner, wake_seq=m.c.wake_seq + 1)
        .execution_options(synchronize_session=False)
    )
    async with write_txn(db) as conn:
        result = await conn.execute(stmt)
    return int(result.rowcount)
