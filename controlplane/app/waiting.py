"""What an operation waits for now, in one sentence, and whether it did what was asked,
from its projection alone: the CLI's ``--wait`` line (:mod:`controlplane.cli.progress`)
and the API's ``waiting_for`` (the dashboard's "waiting in PHASE for ...") say the same.
Each kind says what its phases wait for and which count as success (its ``view.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.store.records import MachineRecord

if TYPE_CHECKING:
    from controlplane.machines.base.views import View


def _view(kind: str) -> View | None:
    # Imported on first use: ``cpctl list`` starts without loading every machine kind.
    from controlplane.machines.catalog import view_of

    return view_of(kind)


def waiting_for(record: MachineRecord) -> str:
    """One line saying what ``record`` waits for now."""
    if record.held:
        return "its turn in the admission queue (a concurrency limit is full)"
    if record.terminal:
        return ("its last actions to be performed" if record.pending_actions
                else "its worker to let go of it")
    if record.pending_actions:
        kinds = sorted({str(a.get("type", "action")) for a in record.pending_actions})
        return "a worker to perform " + ", ".join(kinds)
    view = _view(record.kind)
    said = view.waiting.get(record.phase) if view else None
    return said or "its next observation"


def succeeded(record: MachineRecord) -> bool:
    """Whether ``record`` ended doing what was asked (its kind's success phases)."""
    view = _view(record.kind)
    return record.terminal and view is not None and record.phase in view.success


def settled(record: MachineRecord) -> bool:
    """Terminal, its actions performed and its lease released: nothing more will happen."""
    return record.terminal and record.lease_owner is None and record.next_wake_at is None


def final_pod(record: MachineRecord) -> str | None:
    """``namespace/name`` of the pod the operation left running (``None``: none, or not
    yet), as its kind reads its state."""
    view = _view(record.kind)
    return view.final_pod(record.state, record.phase) if view else None
