"""A drain's children as an operator reads them: the drain's own record of each child,
with the live phase of the ones in flight. Used by ``cpctl get`` on a drain, ``cpctl
drain --wait`` and the HTTP API's drain view."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.machines.drain.state import ChildStatus
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound
from controlplane.store.records import MachineRecord


@dataclass(frozen=True)
class DrainChild:
    """One pod of a drain's plan. ``phase`` is the child migration's phase: live for one
    in flight (one read each, at most the drain's ``max_parallel``), as the drain recorded
    it for one finished, ``None`` while it is not submitted yet or was never started."""

    id: str
    pod: str
    target: str
    status: str
    phase: str | None
    reason: str | None
    started_at: str | None
    finished_at: str | None

    @property
    def outcome(self) -> str:
        """How far it got: the phase when there is one, else the drain's status."""
        return self.phase or self.status


async def drain_children(db: Database, record: MachineRecord) -> list[DrainChild]:
    """The children of drain ``record``, in plan order."""
    raw = record.state.get("children")
    out: list[DrainChild] = []
    for c in raw if isinstance(raw, list) else []:
        if not isinstance(c, dict):
            continue
        phase = str(c.get("phase") or "") or None
        if c.get("status") == ChildStatus.STARTED:
            try:
                phase = (await queries.get_machine(db, str(c.get("id")))).phase
            except MachineNotFound:  # started; its SubmitOperation not performed yet
                phase = None
        out.append(DrainChild(
            id=str(c.get("id")), pod=f"{c.get('namespace')}/{c.get('name')}",
            target=str(c.get("target")), status=str(c.get("status")), phase=phase,
            reason=str(c.get("reason") or "") or None,
            started_at=_text(c.get("started_at")), finished_at=_text(c.get("finished_at"))))
    return out


def _text(value: object) -> str | None:
    return None if value is None else str(value)
