"""The admission queue's storage: live operations by workload and node, held machines,
and letting a held machine in.

The rules (one live operation per workload; per-cluster and per-source-node limits that
queue rather than refuse) are pure functions in ``controlplane.machines.submission``;
this module only reads the facts they need and records the outcome. Called by
``operations.submit_operation`` and the worker's admitter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, case, func, insert, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.engine.decider import Cause
from controlplane.engine.events import Admitted
from controlplane.store import schema
from controlplane.store.database import Database
from controlplane.store.history_rows import event_rows_of
from controlplane.store.session import read_txn, write_txn

m = schema.machines


@dataclass(frozen=True)
class LiveOperation:
    machine_id: str
    kind: str
    workload: str
    source_node: str | None
    held: bool
    version: int


#: Decides over the live operations, inside the admission lock.
Chooser = Callable[[list[LiveOperation]], list[tuple[LiveOperation, str]]]

_ADMISSION_LOCK = 0x6370616471  # "cpadq": serialises admission decisions cluster-wide


async def lock_admission_txn(conn: AsyncConnection) -> None:
    """Serialise admission decisions (PostgreSQL advisory lock; SQLite's single writer
    already serialises), so racing submitters or admitters cannot both take the last
    slot under a limit."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADMISSION_LOCK})


async def live_operations_txn(conn: AsyncConnection) -> list[LiveOperation]:
    """Every non-terminal machine that acts on a workload, oldest first."""
    stmt = (
        select(m.c.id, m.c.kind, m.c.workload, m.c.source_node, m.c.held, m.c.version)
        .where(m.c.terminal.is_(False), m.c.workload.is_not(None))
        .order_by(m.c.created_at, m.c.id)
    )
    rows = (await conn.execute(stmt)).all()
    return [LiveOperation(r.id, r.kind, r.workload, r.source_node, r.held, r.version)
            for r in rows]


@dataclass(frozen=True)
class AdmissionFacts:
    """What a submission's admission needs, counted by the database (a few rows come back
    however many operations are live, though the count itself visits every running one):
    the live operation already on the workload, and the running (not held) operations by
    kind, in the cluster and on the request's source node."""

    same_workload: LiveOperation | None
    running_by_kind: dict[str, int]
    on_node_by_kind: dict[str, int]


async def admission_facts_txn(conn: AsyncConnection, *, workload: str | None,
                              source_node: str | None) -> AdmissionFacts:
    live = and_(m.c.terminal.is_(False), m.c.workload.is_not(None))
    same = None
    if workload is not None:
        r = (await conn.execute(
            select(m.c.id, m.c.kind, m.c.workload, m.c.source_node, m.c.held, m.c.version)
            .where(live, m.c.workload == workload)
            .order_by(m.c.created_at, m.c.id).limit(1))).first()
        if r is not None:
            same = LiveOperation(r.id, r.kind, r.workload, r.source_node, r.held, r.version)
    on_node = (func.sum(case((m.c.source_node == source_node, 1), else_=0))
               if source_node is not None else literal(0))
    rows = (await conn.execute(
        select(m.c.kind, func.count(), on_node)
        .where(live, m.c.held.is_(False)).group_by(m.c.kind))).all()
    return AdmissionFacts(same, {k: int(n) for k, n, _ in rows},
                          {k: int(x or 0) for k, _, x in rows})


async def any_held(db: Database) -> bool:
    async with read_txn(db) as conn:
        return await conn.scalar(select(m.c.id).where(m.c.held.is_(True)).limit(1)) is not None


async def admit_held(db: Database, choose: Chooser, *, now: datetime) -> list[str]:
    """Let in the held machines ``choose`` picks (an ``Admitted`` event each; due now)."""
    admitted = []
    async with write_txn(db) as conn:
        await lock_admission_txn(conn)
        for op, reason in choose(await live_operations_txn(conn)):
            result = await conn.execute(
                update(m)
                .where(m.c.id == op.machine_id, m.c.version == op.version, m.c.held.is_(True))
                .values(held=False, version=op.version + 1, next_wake_at=now,
                        wake_seq=m.c.wake_seq + 1, updated_at=now)
            )
            if result.rowcount != 1:
                continue
            await conn.execute(insert(schema.events), event_rows_of(
                op.machine_id, op.version + 1, [Admitted(reason=reason).recorded()], now,
                "admitter", cause=Cause.ENGINE, decision_input={"admitted": reason}))
            admitted.append(op.machine_id)
    return admitted
