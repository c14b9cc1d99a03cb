"""What an operation produced and how it ended, from its projection alone, per machine
kind: the checkpoint it captured (tag and verified digest), the pod it left running, and
for a settled one success or not, the reason (CamelCase, as the machine recorded it) and
a message.

The terminal ``*Finished`` event carries the machine's reason and message, but the
mirror reads only the ``machines`` row, so the same words are rebuilt here from the state
the event folded into: a failure's ``reason``/``message`` are kept in the state by every
kind (``failure``, a drain's ``reason``/``message``); a success's are fixed per kind and
its message is remade from the state (``Verified``, ``Migrated``, ``RolledBack``,
``Suspended``, ``Resumed``, ``Drained``). Success is the reports' definition
(:data:`controlplane.store.reports.SUCCESS`): a rolled-back migration, one whose artifact
could not be deleted and every cancelled operation count as failed.

Called by :mod:`controlplane.frontdoor.status`. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controlplane.app.operations import final_pod
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base.codec import decode
from controlplane.machines.base.failures import Failure
from controlplane.machines.checkpoint.machine import KIND as CHECKPOINT
from controlplane.machines.checkpoint.machine import CheckpointPhase, CheckpointState
from controlplane.machines.drain.state import KIND as DRAIN
from controlplane.machines.drain.state import DrainState
from controlplane.machines.migration.state import KIND as MIGRATION
from controlplane.machines.migration.state import MigrationPhase, MigrationState
from controlplane.machines.restore.machine import KIND as RESTORE
from controlplane.machines.restore.machine import RestorePhase, RestoreState
from controlplane.machines.resume.machine import KIND as RESUME
from controlplane.machines.resume.machine import ResumePhase, ResumeState
from controlplane.machines.suspend.machine import KIND as SUSPEND
from controlplane.machines.suspend.machine import SuspendPhase, SuspendState
from controlplane.store.records import MachineRecord
from controlplane.store.reports import SUCCESS

CANCELLED = "Cancelled"
BY_OPERATOR = "cancelled by the operator"


@dataclass(frozen=True)
class Outcome:
    """How a terminal operation ended."""

    succeeded: bool
    reason: str
    message: str


def outcome(record: MachineRecord) -> Outcome:
    """The outcome of terminal ``record`` (a kind this module does not know: its phase)."""
    read = _READERS.get(record.kind)
    reason, message = read(record.state) if read else (record.phase, "")
    return Outcome(record.phase in SUCCESS, reason or record.phase, message)


def checkpoint_of(record: MachineRecord) -> dict[str, str] | None:
    """``{artifact: repo:tag, digest: sha256:...}`` of a capturing operation (checkpoint,
    suspend, migration): the tag from the start, the digest once the registry showed the
    pushed artifact with this checkpoint's provenance; ``None`` for the other kinds."""
    data = record.state
    if record.kind == CHECKPOINT:
        c = decode(CheckpointState, data)
        spec, capture = c.spec, c.capture
    elif record.kind == SUSPEND:
        s = decode(SuspendState, data)
        spec, capture = s.spec, s.capture
    elif record.kind == MIGRATION:
        m = decode(MigrationState, data)
        spec, capture = m.spec.capture, m.capture
    else:
        return None
    out = {"artifact": spec.artifact}
    if capture.digest:
        out["digest"] = capture.digest
    return out


def restored_pod(record: MachineRecord) -> str | None:
    """``namespace/name`` of the pod the operation left running
    (:func:`~controlplane.app.operations.final_pod`), and also a migration's cancelled
    after its source was gone: it restores the workload where it was, then ends
    ``Cancelled`` with that pod running."""
    pod = final_pod(record)
    if pod is not None or record.kind != MIGRATION or record.phase != MigrationPhase.CANCELLED:
        return pod
    s = decode(MigrationState, record.state)
    if s.collection is None or s.restore is None:
        return None
    return s.restore.plan.key


def _failed(failure: Failure | None, phase: str) -> tuple[str, str]:
    return (failure.reason, failure.message) if failure else (phase, "")


def _cancelled(failure: Failure | None, default: str = BY_OPERATOR) -> tuple[str, str]:
    """A cancel's reason is ``Cancelled`` even when the machine ended on another one (a
    restore's attempt abandoned, say): the message keeps what happened."""
    return CANCELLED, failure.message if failure and failure.message else default


def _checkpoint(data: JsonObject) -> tuple[str, str]:
    s = decode(CheckpointState, data)
    if s.status is CheckpointPhase.SUCCEEDED:
        verified = f"artifact verified as {s.artifact}"
        op = s.source_op
        if s.spec.quiesce:
            return "Verified", f"{verified}; workload left stopped (quiesce)"
        if op is not None and op.failure is not None:
            return "Verified", f"{verified}; request not withdrawn: {op.failure.message}"
        return "Verified", f"{verified}; capture request withdrawn"
    if s.status is CheckpointPhase.CANCELLED:
        return _cancelled(s.failure)
    return _failed(s.failure, s.phase)


def _restore(data: JsonObject) -> tuple[str, str]:
    s = decode(RestoreState, data)
    if s.status is RestorePhase.SUCCEEDED and s.restore is not None:
        node = s.restore.node or s.restore.plan.node
        return "Verified", f"restored on {node} as instance {s.instance_id}"
    if s.status is RestorePhase.CANCELLED:
        return _cancelled(s.failure)
    return _failed(s.failure, s.phase)


def _migration(data: JsonObject) -> tuple[str, str]:
    s = decode(MigrationState, data)
    collected = s.collection.outcome if s.collection else ""
    running = f"workload running on {s.final_node}" + (
        f"; artifact {collected}" if collected else "")
    if s.status is MigrationPhase.SUCCEEDED:
        return "Migrated", running
    if s.status is MigrationPhase.ROLLED_BACK:
        return "RolledBack", running
    if s.status is MigrationPhase.CANCELLED:
        # Retargeted back to its own node is the one way to end Cancelled uncancelled.
        reason = CANCELLED if s.cancelled else "RetargetedToSource"
        if s.collection is not None:  # the source had gone: restored where it was
            return reason, running
        return reason, f"workload resumed in place on {s.spec.source_node}"
    return _failed(s.failure, s.phase)


def _suspend(data: JsonObject) -> tuple[str, str]:
    s = decode(SuspendState, data)
    if s.status is SuspendPhase.SUSPENDED:
        return "Suspended", f"resume from {s.artifact}"
    if s.status is SuspendPhase.CANCELLED:
        return _cancelled(None, "workload resumed in place")
    return _failed(s.failure, s.phase)


def _resume(data: JsonObject) -> tuple[str, str]:
    s = decode(ResumeState, data)
    r = s.restore
    if s.status is ResumePhase.RESUMED and r is not None:
        how = "cold-booted" if r.plan.artifact is None else f"restored from {r.plan.artifact}"
        return "Resumed", f"{how} as {r.plan.key} on {r.node or r.plan.node}"
    if s.status is ResumePhase.CANCELLED:
        return _cancelled(None)
    return _failed(s.failure, s.phase)


def _drain(data: JsonObject) -> tuple[str, str]:
    s = decode(DrainState, data)  # the drain keeps its finish reason and message
    return s.reason or s.phase, s.message


_READERS: dict[str, Callable[[JsonObject], tuple[str, str]]] = {
    CHECKPOINT: _checkpoint, RESTORE: _restore, MIGRATION: _migration,
    SUSPEND: _suspend, RESUME: _resume, DRAIN: _drain,
}
