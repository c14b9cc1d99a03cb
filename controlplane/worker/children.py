"""The worker's view of machines that run other machines (a drain and its migrations).

:class:`StoreMachineObserver` answers ``Interests.machines`` from the ``machines``
projection: each child's kind, phase, terminal flag and failure reason (``None`` when no
such machine exists yet; a ``ProbeError`` when the database did not answer — never
"absent", safety gate 3 again). The children themselves are created by the
``SubmitOperation`` action, whose handler is a use case (``app.children``).
"""

from __future__ import annotations

from controlplane.engine.observation import (
    Interests,
    MachineFact,
    MachineView,
    Observation,
    ProbeError,
)
from controlplane.store import queries
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
