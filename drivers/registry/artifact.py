"""The checkpoint artifact format (v1): an OCI image whose layers are checkpoint archives. Pure.

One pod-level manifest per checkpoint (``application/vnd.oci.image.manifest.v1+json``):

- ``layers``: one uncompressed tar (``application/vnd.oci.image.layer.v1.tar``) per
  captured container, in capture order — the checkpoint archive exactly as the dumper
  produced it (for the kubelet dumper: the CRI ``ContainerCheckpoint`` archive). Each
  layer's annotations name its container (``org.criu.checkpoint.container.name``) and
  file (``org.opencontainers.image.title``).
- ``config``: a minimal OCI image config (``rootfs.diff_ids`` = the layer digests, the
  layers being uncompressed).
- ``annotations``: the control plane's provenance (:mod:`controlplane.machines.contract.protocol`):
  ``checkpoint-id``, ``source-pod-uid``, ``node``, ``format``, ``protocol-version``, and the
  agent's details: ``archive-bytes`` (sum of the layers), ``containers``, ``pod``,
  ``dumper``, ``org.opencontainers.image.created``; ``container-images`` when the runtime
  restores the archives itself (:mod:`drivers.registry.checkpoint_images`); checkpointctl's
  ``org.criu.checkpoint.pod.name``/``pod.namespace``, ``engine.name`` (when known) and, for
  one container, ``container.name`` / ``rootfsImageName``.

The pod-level manifest never carries ``io.kubernetes.cri-o.annotations.checkpoint.name``
(manifests pushed before container images did, for one container): that key alone makes
CRI-O restore an image, and only a per-container checkpoint image is one. The reader
accepts both. Manifests are serialised canonically (sorted keys, no spaces), so the same
capture always has the same digest. Used by :mod:`drivers.registry.checkpoints`
(push/pull) and documented in ``docs/protocol.md``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.machines.contract import protocol
from drivers.registry.errors import RegistryBadResponse
from drivers.registry.manifests import parse_manifest
from drivers.registry.port import OCI_MANIFEST, Descriptor

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
SEALED_SUFFIX = "+encrypted"  # ocicrypt's layer media type suffix
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"

CRIO_CHECKPOINT_NAME = "io.kubernetes.cri-o.annotations.checkpoint.name"
CRIU_CONTAINER_NAME = "org.criu.checkpoint.container.name"
CRIU_POD_NAME = "org.criu.checkpoint.pod.name"
CRIU_POD_NAMESPACE = "org.criu.checkpoint.pod.namespace"
CRIU_ROOTFS_IMAGE_NAME = "org.criu.checkpoint.rootfsImageName"
CRIU_ENGINE = "org.criu.checkpoint.engine.name"
OCI_CREATED = "org.opencontainers.image.created"
OCI_TITLE = "org.opencontainers.image.title"

ARCHIVE_BYTES = protocol.MANIFEST_ARCHIVE_BYTES
CONTAINERS = protocol.PREFIX + "containers"
POD = protocol.PREFIX + "pod"
DUMPER = protocol.PREFIX + "dumper"
#: Sealed checkpoints: the key ids (``drivers.sealing.keys.key_id``) the layers are
#: encrypted for, comma-separated — what ``cpctl checkpoints`` shows.
SEALED_FOR = protocol.MANIFEST_SEALED_FOR


@dataclass(frozen=True)
class Provenance:
    """Who and what a checkpoint is: written into the manifest annotations."""

    checkpoint_id: str
    source_uid: str
    node: str
    namespace: str
    pod: str
    format: str  # the dumper's archive format, e.g. "kubelet-checkpoint/v1", "sim-marker/v1"
    dumper: str
    created: datetime
    engine: str = ""


@dataclass(frozen=True)
class Layer:
    """One container's archive in the artifact.

    A sealed layer (``descriptor.media_type`` ends ``+encrypted``) carries ocicrypt's
    annotations on its descriptor and, when pushed, ``diff_id``: the digest of the plain
    archive (what the image config lists, as ocicrypt keeps it; a layer read back leaves
    it empty: the sealed options carry it, and unsealing checks it).
    """

    container: str
    descriptor: Descriptor
    image: str = ""  # the container's image (rootfs), when known
    diff_id: str = ""

    @property
    def plain_digest(self) -> str:
        return self.diff_id or self.descriptor.digest

    @property
    def sealed(self) -> bool:
        return self.descriptor.media_type.endswith(SEALED_SUFFIX)


@dataclass(frozen=True)
class CheckpointArtifact:
    """A checkpoint manifest read back: its annotations and its layers."""

    annotations: Mapping[str, str]
    layers: Sequence[Layer] = field(default_factory=tuple)

    @property
    def format(self) -> str:
        return self.annotations.get(protocol.MANIFEST_FORMAT, "")

    @property
    def checkpoint_id(self) -> str:
        return self.annotations.get(protocol.MANIFEST_CHECKPOINT_ID, "")

    @property
    def container_images(self) -> dict[str, str]:
        """Container -> digest of its checkpoint image (empty: none, e.g. a podman archive)."""
        return protocol.container_images(self.annotations)


def image_config(layers: Sequence[Layer], *, architecture: str, created: datetime) -> bytes:
    """A minimal OCI image config whose ``diff_ids`` are the (uncompressed) layers."""
    config = {"architecture": architecture, "os": "linux", "created": timestamp(created),
              "rootfs": {"type": "layers",
                         "diff_ids": [layer.plain_digest for layer in layers]},
              "config": {}}
    return canonical_json(config)


def manifest_annotations(prov: Provenance, layers: Sequence[Layer],
                         container_images: Mapping[str, str] | None = None,
                         sealed_for: Sequence[str] = (),
                         archive_digests: bool = False) -> dict[str, str]:
    """``archive_digests``: also list each plain archive's digest (a handed-off capture,
    whose target compares what it received with what the registry holds)."""
    total = sum(layer.descriptor.size for layer in layers)
    out = {
        protocol.MANIFEST_CHECKPOINT_ID: prov.checkpoint_id,
        protocol.MANIFEST_SOURCE_POD_UID: prov.source_uid,
        protocol.MANIFEST_NODE: prov.node,
        protocol.MANIFEST_FORMAT: prov.format,
        protocol.MANIFEST_PROTOCOL: protocol.PROTOCOL_VERSION,
        ARCHIVE_BYTES: str(total),
        CONTAINERS: ",".join(layer.container for layer in layers),
        POD: f"{prov.namespace}/{prov.pod}",
        DUMPER: prov.dumper,
        OCI_CREATED: timestamp(prov.created),
        CRIU_POD_NAME: prov.pod,
        CRIU_POD_NAMESPACE: prov.namespace,
    }
    if prov.engine:
        out[CRIU_ENGINE] = prov.engine
    if sealed_for:
        out[SEALED_FOR] = ",".join(sealed_for)
    if container_images:
        out[protocol.MANIFEST_CONTAINER_IMAGES] = protocol.format_container_images(
            dict(container_images))
    if archive_digests:
        out[protocol.MANIFEST_ARCHIVE_DIGESTS] = protocol.format_archive_digests(
            {layer.container: layer.plain_digest for layer in layers})
    if len(layers) == 1:
        out[CRIU_CONTAINER_NAME] = layers[0].container
        if layers[0].image:
            out[CRIU_ROOTFS_IMAGE_NAME] = layers[0].image
    return out


def checkpoint_manifest(prov: Provenance, config: Descriptor, layers: Sequence[Layer], *,
                        container_images: Mapping[str, str] | None = None,
                        sealed_for: Sequence[str] = (), archive_digests: bool = False) -> bytes:
    """The pod-level manifest's canonical bytes; ``container_images``: container -> digest
    of its checkpoint image, one for every layer or none."""
    if not layers:
        raise ValueError("a checkpoint has at least one container archive")
    if container_images and set(container_images) != {layer.container for layer in layers}:
        raise ValueError(f"container images {sorted(container_images)} do not match the "
                         f"archives {[layer.container for layer in layers]}")
    listed = []
    for layer in layers:
        annotations = {**layer.descriptor.annotations, CRIU_CONTAINER_NAME: layer.container,
                       OCI_TITLE: f"{layer.container}.tar"}
        if layer.image:
            annotations[CRIU_ROOTFS_IMAGE_NAME] = layer.image
        listed.append(Descriptor(layer.descriptor.media_type, layer.descriptor.digest,
                                 layer.descriptor.size, annotations).to_json())
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": Descriptor(CONFIG_TYPE, config.digest, config.size).to_json(),
                "layers": listed,
                "annotations": manifest_annotations(prov, layers, container_images,
                                                    sealed_for, archive_digests)}
    return canonical_json(manifest)


def read_checkpoint_manifest(body: bytes) -> CheckpointArtifact:
    """Parse a checkpoint manifest; ``RegistryBadResponse`` names what is wrong with it."""
    parsed = parse_manifest(body)
    if parsed.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
        raise RegistryBadResponse(f"not a checkpoint image manifest: mediaType "
                                  f"{parsed.get('mediaType')!r}")
    annotations = parsed.get("annotations") or {}
    if not isinstance(annotations, dict) or protocol.MANIFEST_FORMAT not in annotations:
        raise RegistryBadResponse("not a checkpoint artifact: the manifest has no "
                                  f"{protocol.MANIFEST_FORMAT} annotation")
    single = str(annotations.get(CRIU_CONTAINER_NAME) or
                 annotations.get(CRIO_CHECKPOINT_NAME) or "")
    layers = []
    raw = parsed.get("layers")
    if not isinstance(raw, list) or not raw:
        raise RegistryBadResponse("the checkpoint manifest lists no layers")
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("digest"), str):
            raise RegistryBadResponse("a checkpoint layer has no digest")
        notes = item.get("annotations") if isinstance(item.get("annotations"), dict) else {}
        container = str((notes or {}).get(CRIU_CONTAINER_NAME) or single)
        if not container:
            raise RegistryBadResponse(f"layer {item['digest']} names no container")
        layers.append(Layer(container, Descriptor(
            str(item.get("mediaType", LAYER_TYPE)), item["digest"], int(item.get("size", 0)),
            {str(k): str(v) for k, v in (notes or {}).items()}),
            str((notes or {}).get(CRIU_ROOTFS_IMAGE_NAME, ""))))
    return CheckpointArtifact({str(k): str(v) for k, v in annotations.items()}, tuple(layers))


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
