"""Per-container checkpoint images: the images CRI-O restores a container from. Pure.

CRI-O (read at v1.36.3) restores a container when the image of a ``CreateContainer``
request is an OCI image whose *manifest* carries the annotation
``io.kubernetes.cri-o.annotations.checkpoint.name`` (``server/container_restore.go``,
``checkIfCheckpointOCIImage``); it then mounts the image and reads the checkpoint
archive's files at its root (``spec.dump``, ``config.dump``, ``checkpoint/``,
``rootfs-diff.tar``, ...). So for each container of a checkpoint whose archives CRI-O
wrote (``RUNTIME_RESTORABLE_FORMATS``) the agent also pushes one image:

- one layer, the container's archive blob already pushed for the pod-level manifest
  (uncompressed tar; unpacked at ``/`` it is the archive's files), no layer annotations
  but ocicrypt's when the layer is sealed (CRI-O decrypts it with its node's key);
- its own config: ``rootfs.diff_ids`` = that layer's digest (c/image refuses a mismatch)
  and a ``history`` entry naming the container, so the config, hence CRI-O's image ID,
  never equals the pod-level manifest's (CRI-O caches manifest annotations by image ID);
- manifest annotations: CRI-O's key, checkpointctl's ``org.criu.checkpoint.container.name``
  (and ``rootfsImageName`` / ``engine.name`` when known) and our provenance — never the
  ``org.criu.checkpoint.pod.*`` keys, which describe a pod, not this image.

Each is tagged ``cpimage-<hex of its own manifest digest>``: a registry GC that deletes
untagged manifests keeps it, and the tag can never name anything else. The pod-level
manifest lists them (``protocol.MANIFEST_CONTAINER_IMAGES``). Used by
:mod:`drivers.registry.checkpoints`; documented in ``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.machines.contract import protocol
from drivers.registry.artifact import (
    CONFIG_TYPE,
    CRIO_CHECKPOINT_NAME,
    CRIU_CONTAINER_NAME,
    CRIU_ENGINE,
    CRIU_ROOTFS_IMAGE_NAME,
    OCI_CREATED,
    Layer,
    Provenance,
    canonical_json,
    timestamp,
)
from drivers.registry.port import OCI_MANIFEST, Descriptor

#: Archive formats CRI-O restores by itself: written by the runtime through the kubelet
#: checkpoint API (``drivers.agent.kubelet.FORMAT``). Podman's ``criu-archive/v1`` is not
#: one: its ``spec.dump`` lacks the ``io.kubernetes.cri-o.Annotations`` CRI-O reads.
RUNTIME_RESTORABLE_FORMATS = frozenset({"kubelet-checkpoint/v1"})
TAG_PREFIX = "cpimage-"
OCICRYPT_PREFIX = "org.opencontainers.image.enc."


def restorable_by_runtime(archive_format: str) -> bool:
    """A checkpoint in this format also gets per-container checkpoint images."""
    return archive_format in RUNTIME_RESTORABLE_FORMATS


def image_config(layer: Layer, prov: Provenance, *, architecture: str) -> bytes:
    """The image config of one container's checkpoint image."""
    created = timestamp(prov.created)
    config = {"architecture": architecture, "os": "linux", "created": created,
              "rootfs": {"type": "layers", "diff_ids": [layer.plain_digest]},
              "history": [{"created": created,
                           "created_by": f"checkpoint {prov.checkpoint_id} of "
                                         f"{prov.namespace}/{prov.pod} container "
                                         f"{layer.container}"}],
              "config": {}}
    return canonical_json(config)


def image_annotations(prov: Provenance, layer: Layer) -> dict[str, str]:
    out = {
        CRIO_CHECKPOINT_NAME: layer.container,
        CRIU_CONTAINER_NAME: layer.container,
        protocol.MANIFEST_CHECKPOINT_ID: prov.checkpoint_id,
        protocol.MANIFEST_SOURCE_POD_UID: prov.source_uid,
        protocol.MANIFEST_NODE: prov.node,
        protocol.MANIFEST_FORMAT: prov.format,
        protocol.MANIFEST_PROTOCOL: protocol.PROTOCOL_VERSION,
        OCI_CREATED: timestamp(prov.created),
    }
    if layer.image:
        out[CRIU_ROOTFS_IMAGE_NAME] = layer.image
    if prov.engine:
        out[CRIU_ENGINE] = prov.engine
    return out


def image_manifest(prov: Provenance, config: Descriptor, layer: Layer) -> bytes:
    """The canonical bytes of one container's checkpoint image manifest."""
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": Descriptor(CONFIG_TYPE, config.digest, config.size).to_json(),
                "layers": [Descriptor(layer.descriptor.media_type, layer.descriptor.digest,
                                      layer.descriptor.size,
                                      _sealing(layer.descriptor.annotations)).to_json()],
                "annotations": image_annotations(prov, layer)}
    return canonical_json(manifest)


def _sealing(annotations: Mapping[str, str]) -> dict[str, str]:
    """A sealed layer's ocicrypt annotations (a plain layer here has none: see above)."""
    return {k: v for k, v in annotations.items() if k.startswith(OCICRYPT_PREFIX)}


def image_tag(manifest_digest: str) -> str:
    """The tag that keeps a checkpoint image alive: named after its own digest."""
    algorithm, _, hex_part = manifest_digest.partition(":")
    if algorithm != "sha256" or len(hex_part) != 64:
        raise ValueError(f"not a sha256 digest: {manifest_digest!r}")
    return TAG_PREFIX + hex_part
