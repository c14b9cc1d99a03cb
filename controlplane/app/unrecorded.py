"""Checkpoint artifacts the history does not record, found in the registry by their
provenance — and collected on request.

After the database is restored from a backup, the registry can hold checkpoints that
operations made after the backup was taken: the restored history knows nothing of them.
Every manifest the agents push carries its provenance (``checkpoint-id``,
``source-pod-uid``, ``pod``, ``node``, ``org.opencontainers.image.created``;
:mod:`controlplane.machines.contract.protocol`), and a checkpoint id is the id of the
operation that made it. So each tag of the repositories looked at is resolved, and a
manifest whose checkpoint id names no operation the history records (a machine, or the
summary a prune left) is *unrecorded*. Manifests without our provenance (anything else
stored in the repository) are never listed and never deleted.

Used by ``cpctl checkpoints --unrecorded [--collect]``
(:mod:`controlplane.cli.checkpoints`); docs/install.md, "Backup and restore".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.contract import protocol
from controlplane.store import queries
from controlplane.store.database import Database

#: The manifest annotation with the capture's time (OCI's), and the agent's pod name.
CREATED = "org.opencontainers.image.created"
POD = protocol.PREFIX + "pod"


class ResolvedManifest(Protocol):
    @property
    def digest(self) -> str: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...


class ListingRegistry(Protocol):
    """What finding unrecorded artifacts needs of a registry (``drivers.registry``)."""

    async def list_tags(self, repository: str) -> list[str]: ...

    async def resolve(self, repository: str, reference: str) -> ResolvedManifest | None: ...

    async def delete_manifest(self, repository: str, digest: str) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Unrecorded:
    """A checkpoint in the registry that no recorded operation made."""

    repository: str
    tag: str
    digest: str
    checkpoint_id: str
    workload: str
    source_uid: str
    node: str
    created: str

    @property
    def artifact(self) -> str:
        return f"{self.repository}@{self.digest}"

    def to_json(self) -> JsonObject:
        return {"checkpoint_id": self.checkpoint_id, "workload": self.workload,
                "node": self.node, "created": self.created, "source_uid": self.source_uid,
                "tag": f"{self.repository}:{self.tag}", "artifact": self.artifact}


def _found(repository: str, tag: str, resolved: ResolvedManifest) -> Unrecorded | None:
    a = resolved.annotations
    checkpoint_id = a.get(protocol.MANIFEST_CHECKPOINT_ID, "")
    if not checkpoint_id:
        return None  # not a checkpoint the agents pushed: never ours to judge
    return Unrecorded(repository=repository, tag=tag, digest=resolved.digest,
                      checkpoint_id=checkpoint_id, workload=a.get(POD, ""),
                      source_uid=a.get(protocol.MANIFEST_SOURCE_POD_UID, ""),
                      node=a.get(protocol.MANIFEST_NODE, ""), created=a.get(CREATED, ""))


async def find_unrecorded(db: Database, registry: ListingRegistry,
                          repositories: Sequence[str], *,
                          progress: Callable[[str, int], None] | None = None,
                          ) -> list[Unrecorded]:
    """The checkpoints in ``repositories`` whose operation the history does not record,
    oldest first. ``progress(repository, tags)`` is called as each repository is read."""
    found: list[Unrecorded] = []
    for repository in sorted(set(repositories)):
        tags = await registry.list_tags(repository)
        if progress is not None:
            progress(repository, len(tags))
        for tag in tags:
            resolved = await registry.resolve(repository, tag)
            if resolved is not None and (item := _found(repository, tag, resolved)):
                found.append(item)
    recorded = await queries.recorded_operation_ids(db, [f.checkpoint_id for f in found])
    return sorted((f for f in found if f.checkpoint_id not in recorded),
                  key=lambda f: (f.created, f.repository, f.tag))


async def collect(registry: ListingRegistry, items: Sequence[Unrecorded], *,
                  deleted: Callable[[Unrecorded], None] | None = None) -> int:
    """Delete each item's manifest by digest (every tag on it goes too); how many."""
    done = 0
    for item in items:
        await registry.delete_manifest(item.repository, item.digest)
        done += 1
        if deleted is not None:
            deleted(item)
    return done
