"""Push and pull checkpoint artifacts (the format of :mod:`drivers.registry.artifact`).

:func:`push_checkpoint` uploads each container's archive as a layer, the image config,
then the manifest under the requested tag — blobs first, so the tag never names a
manifest with missing blobs; it returns the manifest digest. :func:`pull_checkpoint`
reads a manifest *by digest* (what a restore names), checks it is a checkpoint artifact,
and downloads every layer into a directory (each blob's sha256 verified). Both work on
any :class:`~drivers.registry.port.Registry` backend. Used by the node agent.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from drivers.registry.artifact import (
    CONFIG_TYPE,
    LAYER_TYPE,
    CheckpointArtifact,
    Layer,
    Provenance,
    checkpoint_manifest,
    image_config,
    read_checkpoint_manifest,
)
from drivers.registry.errors import RegistryBadRequest
from drivers.registry.port import OCI_MANIFEST, Registry

Progress = Callable[[str], Awaitable[None]]
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x"}


@dataclass(frozen=True)
class Archive:
    """One container's checkpoint archive on local disk, ready to push."""

    container: str
    path: Path
    image: str = ""


@dataclass(frozen=True)
class Pushed:
    digest: str
    archive_bytes: int
    manifest: bytes


@dataclass(frozen=True)
class Pulled:
    artifact: CheckpointArtifact
    files: dict[str, Path]  # container -> archive on local disk


async def push_checkpoint(registry: Registry, repository: str, tag: str,
                          archives: Sequence[Archive], prov: Provenance, *,
                          progress: Progress | None = None) -> Pushed:
    layers: list[Layer] = []
    for number, archive in enumerate(archives, 1):
        if progress is not None:
            await progress(f"pushing archive {number}/{len(archives)} ({archive.container})")
        descriptor = await registry.push_blob(repository, archive.path, media_type=LAYER_TYPE)
        layers.append(Layer(archive.container, descriptor, archive.image))
    config_body = image_config(layers, architecture=_ARCH.get(platform.machine(), "amd64"),
                               created=prov.created)
    config = await registry.push_blob(repository, config_body, media_type=CONFIG_TYPE)
    body = checkpoint_manifest(prov, config, layers)
    digest = await registry.push_manifest(repository, body, media_type=OCI_MANIFEST, tag=tag)
    return Pushed(digest, sum(layer.descriptor.size for layer in layers), body)


async def pull_checkpoint(registry: Registry, repository: str, digest: str,
                          dest: Path) -> Pulled:
    manifest = await registry.get_manifest(repository, digest)
    artifact = read_checkpoint_manifest(manifest.body)
    await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for layer in artifact.layers:
        if layer.container in files or "/" in layer.container or layer.container in (".", ".."):
            raise RegistryBadRequest(f"{repository}@{digest}: unusable container name "
                                     f"{layer.container!r} in the checkpoint")
        path = dest / f"{layer.container}.tar"
        await registry.get_blob(repository, layer.descriptor.digest, path)
        files[layer.container] = path
    return Pulled(artifact, files)
