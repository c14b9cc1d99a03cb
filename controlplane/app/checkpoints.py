"""Finding a checkpoint to restore from: the artifact a checkpoint (or suspend) operation
verified, or the newest suspension of a workload — read with one store query each, never
by scanning histories.

A capture's checkpoint id is the id of the machine that made it (``capture_spec``), the
artifact is the one ``ArtifactVerified`` pinned by digest, and the pod it came from is in
the machine's spec. Used by ``cpctl restore`` and ``cpctl resume`` (and the API's), and
``cpctl checkpoints`` (:func:`list_checkpoints`: every verified capture, and whether
``cpctl restore`` can use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import UsageError
from controlplane.machines.base.requests import Checkpoint
from controlplane.machines.contract.protocol import MANIFEST_NODE, MANIFEST_SEALED_FOR
from controlplane.machines.stages.collect import (
    ArtifactDeleted,
    ArtifactDeletionFailed,
    ArtifactDeletionRequested,
)
from controlplane.store import checkpoint_index, queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound

#: The kinds whose verified capture can be restored by ``cpctl restore``.
RESTORABLE = ("checkpoint", "suspend")
#: The garbage-collection events after which an artifact is gone, or going.
GONE = (ArtifactDeleted.NAME, ArtifactDeletionRequested.NAME, ArtifactDeletionFailed.NAME)
RESTORABILITY = checkpoint_index.Restorability(kinds=RESTORABLE, gone=GONE)


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
                             hint="list them with `cpctl checkpoints`") from None
        if record.kind not in RESTORABLE:
            raise UsageError(f"{operation_id} is a {record.kind}, not a checkpoint",
                             hint="name a checkpoint or suspend operation: `cpctl checkpoints` "
                                  "lists them")
        raise UsageError(f"checkpoint {record.id} has no verified artifact (it is "
                         f"{record.phase})", hint="restore a checkpoint that succeeded")
    if found[0].machine.kind not in RESTORABLE:
        raise UsageError(f"{operation_id} is a {found[0].machine.kind}, not a checkpoint",
                         hint="name a checkpoint or suspend operation: `cpctl checkpoints` "
                                  "lists them")
    return _checkpoint(found[0])


async def latest_suspension(db: Database, namespace: str, name: str) -> Checkpoint:
    """The newest suspension of ``namespace/name`` that ended suspended with a checkpoint."""
    for found in await queries.verified_captures(db, workload=f"{namespace}/{name}"):
        if found.machine.kind == "suspend" and found.machine.phase == "Suspended":
            return _checkpoint(found)
    raise UsageError(f"no suspension of {namespace}/{name} is recorded",
                     hint="suspend it first with `cpctl suspend`")


@dataclass(frozen=True)
class Listed:
    """A verified capture as ``cpctl checkpoints`` lists it. ``node``: where it was
    captured (the manifest's node annotation, else the node the pod was on when the
    operation was submitted); ``why_not``: why ``cpctl restore`` cannot use it (``None``:
    it can)."""

    checkpoint_id: str
    kind: str
    phase: str
    workload: str | None
    node: str | None
    klass: str | None  # the class's name, else its repository
    size_bytes: int | None  # the archives' size the manifest declared
    artifact: str  # pinned by digest
    tag: str | None
    verified_at: datetime
    gc_event: str | None  # the artifact's newest garbage-collection event (ArtifactDeleted...)
    gc_at: datetime | None
    why_not: str | None
    #: the key ids its layers are encrypted for (empty: plain), as the manifest names them
    sealed_for: tuple[str, ...] = ()

    @property
    def restorable(self) -> bool:
        return self.why_not is None

    @property
    def why_not_briefly(self) -> str | None:
        """:attr:`why_not` in two words, for a table cell: ``deleted``, ``being deleted``
        (by garbage collection), or ``a migration`` (a capture of a kind ``cpctl restore``
        does not take)."""
        if self.why_not is None:
            return None
        if self.gc_event == ArtifactDeleted.NAME:
            return "deleted"
        if self.gc_event in GONE:
            return "being deleted"
        return f"a {self.kind}"

    def to_json(self) -> JsonObject:
        return {"id": self.checkpoint_id, "kind": self.kind, "phase": self.phase,
                "workload": self.workload, "node": self.node, "class": self.klass,
                "size_bytes": self.size_bytes, "artifact": self.artifact, "tag": self.tag,
                "verified_at": self.verified_at.isoformat(), "gc_event": self.gc_event,
                "gc_at": None if self.gc_at is None else self.gc_at.isoformat(),
                "restorable": self.restorable, "not_restorable_because": self.why_not,
                "encrypted": bool(self.sealed_for), "sealed_for": list(self.sealed_for)}


def why_not_restorable(kind: str, collection: str | None) -> str | None:
    """Why ``cpctl restore`` cannot use a capture, from the store alone (``None``: it
    can); :data:`RESTORABILITY` is the same rule as a store filter. Short: it is a table
    cell."""
    if collection == ArtifactDeleted.NAME:
        return f"deleted by garbage collection after the {kind}'s verified restore"
    if collection in GONE:
        return f"being deleted by garbage collection after the {kind}'s restore"
    if kind not in RESTORABLE:
        return f"a {kind}'s capture: cpctl restore takes checkpoints and suspends"
    return None


def _listed(found: checkpoint_index.IndexedCapture) -> Listed:
    klass = found.klass or {}
    node = found.tag_annotations.get(MANIFEST_NODE) or found.source_node
    size = found.verified.get("size_bytes")
    return Listed(
        checkpoint_id=found.machine_id, kind=found.kind, phase=found.phase,
        workload=found.workload, node=str(node) if node else None,
        klass=str(klass.get("name") or klass.get("repository") or "") or None,
        size_bytes=size if isinstance(size, int) else None,
        artifact=str(found.verified["pinned"]),
        tag=str(found.verified["artifact"]) if found.verified.get("artifact") else None,
        verified_at=found.verified_at,
        gc_event=found.collection, gc_at=found.collected_at,
        why_not=why_not_restorable(found.kind, found.collection),
        sealed_for=tuple(k for k in str(found.tag_annotations.get(MANIFEST_SEALED_FOR) or
                                        "").split(",") if k))


async def list_checkpoints(db: Database, *, workload: str | None = None,
                           restorable_only: bool = False,
                           limit: int = 100) -> tuple[list[Listed], int]:
    """The newest ``limit`` verified captures (checkpoints, suspends, migrations), newest
    first, of one workload (``namespace/name``) or all, only the restorable ones if asked;
    and how many match in all. One store query (two when ``limit`` cuts the list)."""
    found, total = await checkpoint_index.indexed_captures(
        db, workload=workload, restorable=RESTORABILITY if restorable_only else None,
        limit=limit)
    return [_listed(f) for f in found], total
