"""Finding a checkpoint to restore from: the artifact a checkpoint (or suspend) operation
verified, or the newest suspension of a workload — read with one store query each, never
by scanning histories.

A capture's checkpoint id is the id of the machine that made it (``capture_spec``), the
artifact is the one ``ArtifactVerified`` pinned by digest, and the pod it came from is in
the machine's spec. Used by ``cpctl restore`` and ``cpctl resume`` (and the API's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound

#: The kinds whose verified capture can be restored by ``cpctl restore``.
RESTORABLE = ("checkpoint", "suspend")


@dataclass(frozen=True)
class Checkpoint:
    """A verified capture, as a restore or a resume needs it."""

    operation_id: str
    kind: str
    phase: str
    namespace: str
    name: str
    source_uid: str
    artifact: str  # pinned by digest: registry/repo@sha256:...
    verified_at: datetime
    template: JsonObject | None  # a suspend keeps the pod's spec; a checkpoint does not
    klass: JsonObject | None

    @property
    def checkpoint_id(self) -> str:
        return self.operation_id

    def candidate(self) -> JsonObject:
        """This checkpoint as a resume candidate."""
        return {"artifact": self.artifact, "checkpoint_id": self.checkpoint_id,
                "source_uid": self.source_uid}


def _checkpoint(found: queries.VerifiedCapture) -> Checkpoint:
    record = found.machine
    pod = record.spec.get("pod")
    if not isinstance(pod, dict):
        raise UsageError(f"operation {record.id} names no pod in its spec")
    template, klass = record.spec.get("template"), record.spec.get("class")
    return Checkpoint(
        operation_id=record.id, kind=record.kind, phase=record.phase,
        namespace=str(pod["namespace"]), name=str(pod["name"]), source_uid=str(pod["uid"]),
        artifact=str(found.verified["pinned"]), verified_at=found.verified_at,
        template=template if isinstance(template, dict) else None,
        klass=klass if isinstance(klass, dict) else None)


async def checkpoint_of(db: Database, operation_id: str) -> Checkpoint:
    """The verified artifact of checkpoint (or suspend) operation ``operation_id``."""
    found = await queries.verified_captures(db, machine_id=operation_id)
    if not found:
        try:
            record = await queries.get_machine(db, operation_id)
        except MachineNotFound:
            raise UsageError(f"unknown checkpoint {operation_id!r}",
                             hint="list them with `cpctl list --kind checkpoint`") from None
        if record.kind not in RESTORABLE:
            raise UsageError(f"{operation_id} is a {record.kind}, not a checkpoint",
                             hint="name a checkpoint or suspend operation")
        raise UsageError(f"checkpoint {record.id} has no verified artifact (it is "
                         f"{record.phase})", hint="restore a checkpoint that succeeded")
    if found[0].machine.kind not in RESTORABLE:
        raise UsageError(f"{operation_id} is a {found[0].machine.kind}, not a checkpoint",
                         hint="name a checkpoint or suspend operation")
    return _checkpoint(found[0])


async def latest_suspension(db: Database, namespace: str, name: str) -> Checkpoint:
    """The newest suspension of ``namespace/name`` that ended suspended with a checkpoint."""
    for found in await queries.verified_captures(db, workload=f"{namespace}/{name}"):
        if found.machine.kind == "suspend" and found.machine.phase == "Suspended":
            return _checkpoint(found)
    raise UsageError(f"no suspension of {namespace}/{name} is recorded",
                     hint="suspend it first with `cpctl suspend`")
