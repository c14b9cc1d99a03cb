"""Push, pull and delete checkpoint artifacts (the format of :mod:`drivers.registry.artifact`).

:func:`push_checkpoint` uploads each container's archive as a layer, the image config,
then — for archives the runtime restores itself (CRI-O's, see
:mod:`drivers.registry.checkpoint_images`) — one checkpoint image per container, reusing
the layer blob, and last the pod-level manifest under the requested tag, listing those
images: everything a manifest names is in the registry before the manifest, and all of
it before the tag, so the tag never names a checkpoint with missing parts. It returns
the manifest digest and the per-container images. Sealed archives (encrypted by the
agent, :mod:`drivers.sealing`) are pushed as they are, with their media type and
ocicrypt annotations; with ``sign``, the manifest is pushed by digest, signed, and only
then tagged. :func:`pull_checkpoint` reads a manifest *by digest* (what a restore
names), checks it is a checkpoint artifact, and downloads every layer into a directory
(each blob's sha256 verified), unsealing sealed layers through the caller's ``unseal``.
:func:`checkpoint_image_refs` answers which image each container of a stored checkpoint
is restored from (``registry/repo@sha256:...``, what a restore pod names);
:func:`delete_checkpoint` deletes a checkpoint with its per-container images. All work
on any :class:`~drivers.registry.port.Registry` backend. Used by the node agent, the
``DeleteManifest`` handler and the real-node tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.machines.contract import protocol
from drivers.registry import checkpoint_images
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
from drivers.registry.errors import RegistryBadRequest, RegistryBadResponse, RegistryNotFound
from drivers.registry.manifests import manifest_annotations
from drivers.registry.port import OCI_MANIFEST, Descriptor, Registry, sha256_digest

Progress = Callable[[str], Awaitable[None]]
Sign = Callable[[str], Awaitable[object]]  # given a manifest digest: sign it
Unseal = Callable[[Path, Path, Layer], object]  # sealed file, plain file to write, layer
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x"}


@dataclass(frozen=True)
class Archive:
    """One container's checkpoint archive on local disk, ready to push.

    A sealed archive is the encrypted file: its ``media_type`` ends ``+encrypted``, its
    ``annotations`` are ocicrypt's and ``diff_id`` is the plain archive's digest.
    """

    container: str
    path: Path
    image: str = ""
    media_type: str = LAYER_TYPE
    annotations: Mapping[str, str] = field(default_factory=dict)
    diff_id: str = ""
    digest: str | None = None  # of the file at ``path``, when already known (sealed)


@dataclass(frozen=True)
class Pushed:
    digest: str
    archive_bytes: int
    manifest: bytes
    #: container -> digest of its checkpoint image (empty when the runtime cannot restore)
    container_images: Mapping[str, str] = field(default_factory=dict)

    def image_refs(self, repository: str) -> dict[str, str]:
        """Container -> ``repository@sha256:...``: the images of a restore pod."""
        return protocol.container_image_refs(f"{repository}@{self.digest}",
                                             self.container_images)


@dataclass(frozen=True)
class Pulled:
    artifact: CheckpointArtifact
    files: dict[str, Path]  # container -> archive on local disk


async def push_checkpoint(registry: Registry, repository: str, tag: str,
                          archives: Sequence[Archive], prov: Provenance, *,
                          progress: Progress | None = None, sealed_for: Sequence[str] = (),
                          sign: Sign | None = None, archive_digests: bool = False) -> Pushed:
    """Push ``archives`` as one checkpoint under ``tag``; ``sign`` (given the manifest
    digest) runs after the manifest is in the registry and before the tag names it, so a
    tag never names an unsigned checkpoint of ours. ``archive_digests``: the manifest
    also lists each plain archive's digest (a handed-off capture)."""
    layers: list[Layer] = []
    for number, archive in enumerate(archives, 1):
        if progress is not None:
            await progress(f"pushing archive {number}/{len(archives)} ({archive.container})")
        pushed = await registry.push_blob(repository, archive.path,
                                          media_type=archive.media_type, digest=archive.digest)
        descriptor = Descriptor(archive.media_type, pushed.digest, pushed.size,
                                dict(archive.annotations))
        layers.append(Layer(archive.container, descriptor, archive.image, archive.diff_id))
    architecture = _ARCH.get(platform.machine(), "amd64")
    config_body = image_config(layers, architecture=architecture, created=prov.created)
    config = await registry.push_blob(repository, config_body, media_type=CONFIG_TYPE)
    images: dict[str, str] = {}
    if checkpoint_images.restorable_by_runtime(prov.format):
        for number, layer in enumerate(layers, 1):
            if progress is not None:
                await progress(f"pushing checkpoint image {number}/{len(layers)} "
                               f"({layer.container})")
            images[layer.container] = await _push_container_image(
                registry, repository, layer, prov, architecture=architecture)
    body = checkpoint_manifest(prov, config, layers, container_images=images,
                               sealed_for=sealed_for, archive_digests=archive_digests)
    if sign is not None:
        digest = await registry.push_manifest(repository, body, media_type=OCI_MANIFEST)
        if progress is not None:
            await progress("signing the checkpoint manifest")
        await sign(digest)
    digest = await registry.push_manifest(repository, body, media_type=OCI_MANIFEST, tag=tag)
    return Pushed(digest, sum(layer.descriptor.size for layer in layers), body, images)


async def _push_container_image(registry: Registry, repository: str, layer: Layer,
                                prov: Provenance, *, architecture: str) -> str:
    config_body = checkpoint_images.image_config(layer, prov, architecture=architecture)
    config = await registry.push_blob(repository, config_body, media_type=CONFIG_TYPE)
    body = checkpoint_images.image_manifest(prov, config, layer)
    return await registry.push_manifest(
        repository, body, media_type=OCI_MANIFEST,
        tag=checkpoint_images.image_tag(sha256_digest(body)))


async def pull_checkpoint(registry: Registry, repository: str, digest: str,
                          dest: Path, *, unseal: Unseal | None = None) -> Pulled:
    """Download every layer of ``repository@digest`` into ``dest``; a sealed layer is
    unsealed by ``unseal(sealed file, plain file, layer)`` (in a thread) and its
    encrypted copy removed. A sealed checkpoint without ``unseal`` is refused."""
    manifest = await registry.get_manifest(repository, digest)
    artifact = read_checkpoint_manifest(manifest.body)
    if unseal is None and any(layer.sealed for layer in artifact.layers):
        raise RegistryBadRequest(f"{repository}@{digest} is sealed (encrypted layers) and "
                                 "this reader has no key to unseal it")
    await asyncio.to_thread(dest.mkdir, mode=0o700, parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for layer in artifact.layers:
        if layer.container in files or "/" in layer.container or layer.container in (".", ".."):
            raise RegistryBadRequest(f"{repository}@{digest}: unusable container name "
                                     f"{layer.container!r} in the checkpoint")
        path = dest / f"{layer.container}.tar"
        if layer.sealed and unseal is not None:
            sealed = dest / f"{layer.container}.sealed"
            await registry.get_blob(repository, layer.descriptor.digest, sealed)
            try:
                await asyncio.to_thread(unseal, sealed, path, layer)
            finally:
                await asyncio.to_thread(sealed.unlink, True)
        else:
            await registry.get_blob(repository, layer.descriptor.digest, path)
        files[layer.container] = path
    return Pulled(artifact, files)


async def checkpoint_image_refs(registry: Registry, repository: str,
                                digest: str) -> dict[str, str]:
    """Container -> ``repository@sha256:...`` of its checkpoint image, for the checkpoint
    ``repository@digest``; empty when the runtime cannot restore it (no images)."""
    manifest = await registry.get_manifest(repository, digest)
    artifact = read_checkpoint_manifest(manifest.body)
    return protocol.container_image_refs(f"{repository}@{digest}", artifact.container_images)


async def delete_checkpoint(registry: Registry, repository: str, digest: str) -> None:
    """Delete the manifest ``digest`` and the per-container checkpoint images it lists.

    The images go first: if this is interrupted, the manifest still lists what is left,
    so doing it again finishes the job (an image already gone is no error). Deleting the
    manifest first would lose the list and leave tagged images behind for good.
    ``RegistryNotFound`` when the manifest itself is gone (done, for the caller).
    """
    manifest = await registry.get_manifest(repository, digest)
    try:
        images = protocol.container_images(manifest_annotations(manifest.body))
    except RegistryBadResponse:  # not a JSON manifest: it lists nothing of ours
        images = {}
    for image in sorted(set(images.values()) - {digest}):
        with contextlib.suppress(RegistryNotFound):
            await registry.delete_manifest(repository, image)
    await registry.delete_manifest(repository, digest)
