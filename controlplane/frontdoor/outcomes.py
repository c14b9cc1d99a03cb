"""What an operation produced and how it ended, for a resource's status: the checkpoint it
captured (tag and verified digest), the pod it left running, and for a settled one
success or not, the reason (CamelCase, as the machine recorded it) and a message.

The terminal ``*Finished`` event carries the machine's reason and message, but the
mirror reads only the ``machines`` row, so each kind rebuilds the same words from the
state the event folded into (its ``view.py``); success is the one definition every
reader shares (``View.success``). A kind this build does not know reads as its phase.

Called by :mod:`controlplane.frontdoor.status`. Pure.
"""

from __future__ import annotations

from controlplane.machines.base.views import Outcome
from controlplane.machines.catalog import view_of
from controlplane.store.records import MachineRecord

__all__ = ["Outcome", "checkpoint_of", "outcome", "restored_pod"]


def outcome(record: MachineRecord) -> Outcome:
    """The outcome of terminal ``record``."""
    view = view_of(record.kind)
    if view is None:
        return Outcome(False, record.phase, "")
    return view.outcome(record.state, record.phase)


def checkpoint_of(record: MachineRecord) -> dict[str, str] | None:
    """``{artifact: repo:tag, digest: sha256:...}`` of a capturing operation (checkpoint,
    suspend, migration): the tag from the start, the digest once the registry showed the
    pushed artifact with this checkpoint's provenance; ``None`` for the other kinds."""
    view = view_of(record.kind)
    return view.checkpoint(record.state) if view else None


def restored_pod(record: MachineRecord) -> str | None:
    """``namespace/name`` of the pod the operation left running (a migration cancelled
    after its source was gone included: it restored the workload where it was)."""
    view = view_of(record.kind)
    return view.final_pod(record.state, record.phase) if view else None
