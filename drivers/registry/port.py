"""The registry port: what the control plane and the node agent need from an OCI registry.

Two backends implement :class:`Registry`, and one contract suite
(``tests/registry/test_registry_contract.py``) runs against both:

- :class:`~drivers.registry.client.RegistryClient`: the OCI Distribution API v2 over HTTP
  (anonymous, basic or bearer-token auth), for a real registry;
- :class:`~drivers.registry.layout.OciLayout`: OCI image layouts on disk, one per
  repository, the embedded default.

Repositories are named as in artifact references and ``DeleteManifest`` params:
``registry/repo`` (``localhost:5000/checkpoints/app``). A *reference* is a tag or a
``sha256:`` digest. Every method raises a :class:`~drivers.registry.errors.RegistryError`
subclass on failure; :meth:`Registry.resolve` alone answers "absent" (``None``), and only
for a definite 404 (safety gate 3). Used by the observer, the ``DeleteManifest``
handler and the node agent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: what a manifest lists for a blob."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"mediaType": self.media_type, "digest": self.digest,
                                  "size": self.size}
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out


@dataclass(frozen=True)
class Manifest:
    """A manifest as stored: its exact bytes (the digest is of these), type and digest."""

    digest: str
    media_type: str
    body: bytes

    @property
    def size(self) -> int:
        return len(self.body)


@dataclass(frozen=True)
class Resolved:
    """A reference resolved: the manifest digest and the manifest's annotations."""

    digest: str
    media_type: str
    annotations: Mapping[str, str] = field(default_factory=dict)


class Registry(Protocol):
    """An OCI registry, over HTTP or on disk."""

    async def resolve(self, repository: str, reference: str) -> Resolved | None:
        """The manifest a tag or digest names, or ``None`` if it definitely does not exist."""
        ...

    async def get_manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest's bytes (digest verified); ``RegistryNotFound`` if absent."""
        ...

    async def get_blob(self, repository: str, digest: str, dest: Path) -> int:
        """Write the blob to ``dest`` (digest verified; atomically); its size in bytes."""
        ...

    async def push_blob(self, repository: str, source: Path | bytes, *,
                        media_type: str = "application/octet-stream",
                        digest: str | None = None) -> Descriptor:
        """Upload a blob (skipped when the registry already has it); its descriptor.
        ``digest``: the caller's sha256 of ``source`` when it has one (a sealed layer's,
        computed while encrypting), so the file is not read twice; the upload still
        checks it, and a wrong one fails."""
        ...

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        """Store a manifest (under ``tag``, if given); its digest."""
        ...

    async def delete_manifest(self, repository: str, digest: str) -> None:
        """Delete the manifest by digest (every tag pointing at it goes too)."""
        ...

    async def close(self) -> None:
        ...
