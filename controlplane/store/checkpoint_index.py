"""The checkpoint index: every verified capture with what listing it needs — the
machine, its ``ArtifactVerified`` event and the newest garbage-collection event of its
artifact — in one query, whatever the length of the histories (a second one counts the
matches when the limit cuts the list).

Read by :func:`controlplane.app.checkpoints.list_checkpoints` (``cpctl checkpoints``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select

from controlplane.machines.stages.capture import ArtifactVerified
from controlplane.machines.stages.collect import COLLECT_EVENTS
from controlplane.store import codec, schema
from controlplane.store.database import Database
from controlplane.store.session import read_txn

m = schema.machines
verified = schema.events.alias("verified")
collected = schema.events.alias("collected")

#: The events of an artifact's garbage collection (deleted, kept, abandoned...).
COLLECTION = tuple(sorted(cls.NAME for cls in COLLECT_EVENTS))


@dataclass(frozen=True)
class Restorability:
    """What a restorable capture is, as a filter: its machine's kind is one of ``kinds``
    and its artifact's newest garbage-collection event, if any, is none of ``gone``."""

    kinds: tuple[str, ...]
    gone: tuple[str, ...]


@dataclass(frozen=True)
class IndexedCapture:
    """One verified capture. ``verified`` is the ``ArtifactVerified`` data (``pinned``,
    ``digest``, ``artifact``, ``size_bytes``); ``tag_annotations`` the manifest
    annotations the registry showed when it verified; ``collection`` the type of the
    artifact's newest garbage-collection event (``None``: none recorded)."""

    machine_id: str
    kind: str
    phase: str
    workload: str | None
    source_node: str | None
    klass: dict[str, Any] | None
    verified: dict[str, Any]
    tag_annotations: dict[str, Any]
    verified_at: datetime
    collection: str | None
    collected_at: datetime | None


def _newest_collection(column: Any) -> Any:
    """``column`` of the newest garbage-collection event of the verified capture's machine
    (NULL: none), a correlated subquery: found by the ``(machine_id, seq)`` key, it reads
    that machine's events only, and only for the rows that need it."""
    return (select(column)
            .where(collected.c.machine_id == verified.c.machine_id,
                   collected.c.type.in_(COLLECTION))
            .order_by(collected.c.seq.desc()).limit(1).scalar_subquery())


def _select(columns: Select[Any], *, workload: str | None,
            restorable: Restorability | None) -> Select[Any]:
    stmt = (columns.select_from(verified.join(m, m.c.id == verified.c.machine_id))
            .where(verified.c.type == ArtifactVerified.NAME))
    if workload is not None:
        stmt = stmt.where(m.c.workload == workload)
    if restorable is not None:
        # coalesce: NOT IN over a NULL (no collection event) would be NULL, not true.
        stmt = stmt.where(m.c.kind.in_(restorable.kinds),
                          func.coalesce(_newest_collection(collected.c.type), "")
                          .not_in(restorable.gone))
    return stmt


def _annotations(facts: Any) -> dict[str, Any]:
    """The manifest's annotations among an ``ArtifactVerified`` event's facts."""
    found = facts.get("tag_annotations") if isinstance(facts, dict) else None
    return found if isinstance(found, dict) else {}


async def indexed_captures(db: Database, *, workload: str | None = None,
                           restorable: Restorability | None = None,
                           limit: int) -> tuple[list[IndexedCapture], int]:
    """The newest ``limit`` verified captures (newest verification first), optionally of
    one workload (``namespace/name``) and only the ``restorable`` ones; and how many
    match in all (counted only when ``limit`` cuts the list)."""
    columns = select(m.c.id, m.c.kind, m.c.phase, m.c.workload, m.c.source_node,
                     m.c.spec["class"].label("klass"), verified.c.data,
                     verified.c.facts, verified.c.facts_z,
                     verified.c.recorded_at,
                     _newest_collection(collected.c.type).label("collection"),
                     _newest_collection(collected.c.recorded_at).label("collected_at"))
    newest_first = (verified.c.recorded_at.desc(), m.c.id)
    # The page is picked first and its columns computed after: SQLite would otherwise
    # compute every match's class and collection subqueries before sorting.
    page = (_select(select(verified.c.position), workload=workload, restorable=restorable)
            .order_by(*newest_first).limit(limit))
    stmt = (columns.select_from(verified.join(m, m.c.id == verified.c.machine_id))
            .where(verified.c.position.in_(page)).order_by(*newest_first))
    async with read_txn(db) as conn:
        rows = (await conn.execute(stmt)).all()
        total = len(rows)
        if total == limit:
            count = _select(select(func.count()), workload=workload, restorable=restorable)
            total = int((await conn.execute(count)).scalar_one())
    found = [IndexedCapture(
        machine_id=r.id, kind=r.kind, phase=r.phase, workload=r.workload,
        source_node=r.source_node, klass=r.klass if isinstance(r.klass, dict) else None,
        verified=dict(r.data), verified_at=r.recorded_at,
        tag_annotations=_annotations(codec.from_columns(r.facts, r.facts_z)),
        collection=r.collection, collected_at=r.collected_at) for r in rows]
    return found, total
