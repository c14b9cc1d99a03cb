"""The worker's view of machines that run other machines (a drain and its migrations).

:class:`StoreMachineObserver` answers ``Interests.machines`` from the ``machines``
projection: each child's kind, phase, terminal flag and failure reason (``None`` when no
such machine exists yet; a ``ProbeError`` when the database did not answer — never
"absent", safety gate 3 again). The children themselves are created by the
``SubmitOperation`` action, whose handler is a use case (``app.child_submitter``).

:func:`wake_parents`: the worker calls it once a machine turns terminal, so the parent
that indexed the child's ``machine_key`` is due at once instead of at its next re-check.
It is a row update (``next_wake_at``, ``wake_seq``), so a parent held by another worker
process is woken too: due now when that worker releases it, or claimed by whichever
worker polls first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.engine.observation import (
    Interests,
    MachineFact,
    MachineView,
    Observation,
    ProbeError,
)
from controlplane.machines.drain.state import machine_key
from controlplane.store import leases, queries
from controlplane.store.database import Database
from controlplane.store.errors import DatabaseUnavailable, MachineNotFound


class StoreMachineObserver:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def observe(self, interests: Interests) -> Observation:
        return Observation(machines={mid: await self._one(mid)
                                     for mid in sorted(interests.machines)})

    async def _one(self, machine_id: str) -> MachineFact:
        try:
            record = await queries.get_machine(self.db, machine_id)
        except MachineNotFound:
            return None
        except DatabaseUnavailable as exc:
            return ProbeError("DatabaseUnavailable", str(exc))
        failure = record.state.get("failure")
        reason = failure.get("reason") if isinstance(failure, dict) else None
        return MachineView(record.id, record.kind, record.phase, record.terminal,
                           str(reason or ""))


async def wake_parents(db: Database, machine_ids: Sequence[str], *, now: datetime) -> int:
    """Make every live machine waiting on one of ``machine_ids`` due now (a drain whose
    children ended); returns how many woke. One statement for them all."""
    return await leases.wake_by_keys(db, keys=[machine_key(m) for m in machine_ids], now=now)
