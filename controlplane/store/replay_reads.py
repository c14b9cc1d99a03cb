"""Replay's read path for ``rebuild``: each stored projection with the events that fold into it.

``rebuild`` folds events and compares the result with the stored projection, so it reads
only what those two need: of a machine its id, kind, phase, version, terminal flag and
state; of an event its seq, type and data. Not the recorded decisions (``verify`` reads
those, through ``queries.stream_histories``), not an event's ``facts`` (the observation
that justified it: history's *why*, which ``evolve`` never reads — a rebuild that needed
them would mismatch the projections the workers wrote), not the spec column (the
``Submitted`` event carries it).

The JSON columns are read as text and decoded with ``orjson`` (a state stored compressed,
since revision 0007, through ``codec``): the driver's per-value
JSON codec and the ORM-free row mapping were most of a rebuild's time (8k events/s read;
see ``docs/performance.md``). Batches are large, in id order, and the next batch is read
while the caller folds the current one, so the database's time overlaps the fold.

Called by :func:`controlplane.app.replay.rebuild` and the replay benchmark.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Text, cast, func, select

from controlplane.engine.jsonvalue import JsonObject
from controlplane.store import codec, schema
from controlplane.store.database import Database
from controlplane.store.session import read_txn

m = schema.machines
e = schema.events


@dataclass(frozen=True)
class StoredProjection:
    """The projection a rebuild checks: what the workers last wrote for one machine."""

    id: str
    kind: str
    phase: str
    version: int
    terminal: bool
    state: JsonObject


class FoldEvent(NamedTuple):
    """One event as a fold needs it (a tuple: a million of them are built per rebuild)."""

    seq: int
    type: str
    data: JsonObject


Batch = list[tuple[StoredProjection, list[FoldEvent]]]

_MACHINES = select(m.c.id, m.c.kind, m.c.phase, m.c.version, m.c.terminal,
                   cast(m.c.state, Text), m.c.state_z).order_by(m.c.id)
_EVENTS = select(e.c.machine_id, e.c.seq, e.c.type, cast(e.c.data, Text)).order_by(
    e.c.machine_id, e.c.seq)


def _object(text: Any, compressed: bytes | None = None) -> JsonObject:
    value = codec.decode(compressed) if compressed is not None else orjson.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object in the store, got {type(value).__name__}")
    return value


async def _batch(db: Database, after: str, size: int, until: str | None) -> Batch:
    pick = _MACHINES.where(m.c.id > after)
    if until is not None:
        pick = pick.where(m.c.id <= until)
    async with read_txn(db) as conn:
        rows = (await conn.execute(pick.limit(size))).all()
        if not rows:
            return []
        first, last = rows[0][0], rows[-1][0]
        ev_rows = (await conn.execute(
            _EVENTS.where(e.c.machine_id >= first, e.c.machine_id <= last))).all()
    by_machine: dict[str, list[FoldEvent]] = {str(r[0]): [] for r in rows}
    loads = orjson.loads
    for machine_id, seq, type_, data in ev_rows:
        by_machine[machine_id].append(FoldEvent(seq, type_, loads(data)))
    return [(StoredProjection(str(r[0]), str(r[1]), str(r[2]), int(r[3]), bool(r[4]),
                              _object(r[5], r[6])), by_machine[str(r[0])])
            for r in rows]


async def count_machines(db: Database) -> int:
    """How many machines a rebuild will fold (for its progress)."""
    async with read_txn(db) as conn:
        return int(await conn.scalar(select(func.count()).select_from(m)) or 0)


async def split_ids(db: Database, parts: int) -> list[tuple[str, str | None]]:
    """``parts`` id ranges ``(after, until]`` with about as many machines each, in order,
    covering every machine (the last is open-ended: machines added meanwhile land there).
    """
    async with read_txn(db) as conn:
        ids = [str(i) for i in (await conn.execute(select(m.c.id).order_by(m.c.id))).scalars()]
    if parts <= 1 or len(ids) < 2 * parts:
        return [("", None)]
    cuts = [ids[len(ids) * k // parts - 1] for k in range(1, parts)]
    bounds = ["", *cuts]
    return [(bounds[k], cuts[k] if k < len(cuts) else None) for k in range(parts)]


async def stream_events(db: Database, *, batch_machines: int = 2000, after: str = "",
                        until: str | None = None,
                        ) -> AsyncIterator[tuple[StoredProjection, list[FoldEvent]]]:
    """Every machine's projection with its events in seq order, in id order; one batch read
    ahead. ``after``/``until``: only ids in ``(after, until]`` (a parallel rebuild's share).
    """
    batch = await _batch(db, after, batch_machines, until)
    while batch:
        ahead = asyncio.ensure_future(_batch(db, batch[-1][0].id, batch_machines, until))
        try:
            for item in batch:
                yield item
        except BaseException:
            ahead.cancel()
            raise
        batch = await ahead
