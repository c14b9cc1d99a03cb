"""Per-container checkpoint images: the images CRI-O (1.36.3) restores a container from.

Run on both backends (the OCI layout and a real registry) where the registry matters.
Pins: a checkpoint whose archives the runtime wrote (the kubelet dumper's format) gets one
image per container, of exactly the shape CRI-O's source requires (the archive blob as
its only, uncompressed layer; its own config whose ``diff_ids`` is that layer; CRI-O's
``io.kubernetes.cri-o.annotations.checkpoint.name`` and no ``org.criu.checkpoint.pod.*``
key), tagged after its own digest and pushed before the checkpoint's tag; the pod-level
manifest lists them and no longer carries CRI-O's key; deleting the checkpoint deletes
them, and an interrupted delete is finished by the retry; podman and simulator
checkpoints get none; a manifest pushed before this change still reads and deletes.
"""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.machines.contract.actions import delete_manifest
from drivers.agent import criu, kubelet, sim
from drivers.registry import ManifestActions
from drivers.registry.artifact import Provenance, read_checkpoint_manifest
from drivers.registry.checkpoint_images import RUNTIME_RESTORABLE_FORMATS
from drivers.registry.checkpoints import (
    Archive,
    Pushed,
    checkpoint_image_refs,
    pull_checkpoint,
    push_checkpoint,
)
from drivers.registry.errors import RegistryNotFound
from drivers.registry.port import OCI_MANIFEST, Descriptor, Manifest, Registry, Resolved
from drivers.registry.port import sha256_digest as digest_of
from tests.registry.backends import Backend

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KUBELET = "kubelet-checkpoint/v1"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
CRIO_NAME = "io.kubernetes.cri-o.annotations.checkpoint.name"
CRIU_NAME = "org.criu.checkpoint.container.name"
CP = "checkpoint.controlplane.dev/"


def provenance(fmt: str = KUBELET, checkpoint_id: str = "ck-1", engine: str = "") -> Provenance:
    return Provenance(checkpoint_id=checkpoint_id, source_uid="uid-1", node="node-1",
                      namespace="default", pod="app", format=fmt, dumper="kubelet",
                      created=CREATED, engine=engine)


def cri_o_archive(tmp_path: Path, container: str, memory: bytes) -> Path:
    """An archive laid out as CRI-O writes one for the kubelet (files at its root)."""
    spec = {"annotations": {"io.kubernetes.cri-o.Annotations": json.dumps(
        {"io.kubernetes.pod.uid": "uid-1"})}}
    files = {"config.dump": json.dumps({"id": "3f2a", "name": container,
                                        "rootfsImageName": "quay.io/app:1"}).encode(),
             "spec.dump": json.dumps(spec).encode(),
             "checkpoint/pages-1.img": memory, "rootfs-diff.tar": b""}
    out = tmp_path / f"{container}-{digest_of(memory)[7:15]}.tar"
    with tarfile.open(out, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


async def push_two(b: Backend, tmp_path: Path, *, tag: str = "ck-1",
                   checkpoint_id: str = "ck-1") -> tuple[Pushed, list[Archive]]:
    archives = [Archive("main", cri_o_archive(tmp_path, "main", f"m-{tag}".encode()),
                        image="quay.io/app:1"),
                Archive("sidecar", cri_o_archive(tmp_path, "sidecar", f"s-{tag}".encode()))]
    pushed = await push_checkpoint(b.registry, b.repo(), tag, archives,
                                   provenance(checkpoint_id=checkpoint_id))
    return pushed, archives


async def blob_json(b: Backend, digest: str, tmp_path: Path) -> object:
    path = tmp_path / f"blob-{digest[7:19]}"
    await b.registry.get_blob(b.repo(), digest, path)
    return json.loads(path.read_bytes())


async def test_each_container_gets_the_checkpoint_image_cri_o_restores(
        backend: Backend, tmp_path: Path) -> None:
    """The per-container manifest, byte for byte as CRI-O needs it: one uncompressed layer
    that is the archive blob, a config whose diff_ids is that layer, CRI-O's key and
    checkpointctl's, our provenance, no pod key, no layer annotation; tagged
    ``cpimage-<its own digest>``."""
    pushed, archives = await push_two(backend, tmp_path)
    assert sorted(pushed.container_images) == ["main", "sidecar"]
    for archive in archives:
        data = archive.path.read_bytes()
        image = pushed.container_images[archive.container]
        stored = await backend.registry.get_manifest(backend.repo(), image)
        assert stored.media_type == OCI_MANIFEST
        body = json.loads(stored.body)
        config = body.pop("config")
        assert config["mediaType"] == OCI_CONFIG
        expected_notes = {
            CRIO_NAME: archive.container, CRIU_NAME: archive.container,
            CP + "checkpoint-id": "ck-1", CP + "source-pod-uid": "uid-1",
            CP + "node": "node-1", CP + "format": KUBELET, CP + "protocol-version": "v1",
            "org.opencontainers.image.created": "2026-01-02T03:04:05Z"}
        if archive.image:
            expected_notes["org.criu.checkpoint.rootfsImageName"] = archive.image
        assert body == {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                        "layers": [{"mediaType": OCI_LAYER, "digest": digest_of(data),
                                    "size": len(data)}],
                        "annotations": expected_notes}
        assert not any(key.startswith("org.criu.checkpoint.pod.") for key in expected_notes)
        image_config = await blob_json(backend, config["digest"], tmp_path)
        assert isinstance(image_config, dict)
        assert image_config["rootfs"] == {"type": "layers", "diff_ids": [digest_of(data)]}
        assert image_config["os"] == "linux"
        assert image_config["history"] == [{
            "created": "2026-01-02T03:04:05Z",
            "created_by": f"checkpoint ck-1 of default/app container {archive.container}"}]
        by_tag = await backend.registry.resolve(backend.repo(), "cpimage-" + image[7:])
        assert by_tag is not None
        assert by_tag.digest == image


async def test_the_pod_manifest_lists_the_images_and_is_not_one_itself(
        backend: Backend, tmp_path: Path) -> None:
    """``container-images`` names each container's image digest; the pod-level manifest
    keeps its layers (the same blobs) and checkpointctl's pod keys, but not CRI-O's key,
    which would make CRI-O take a multi-archive manifest for a container image."""
    pushed, archives = await push_two(backend, tmp_path)
    notes = json.loads(pushed.manifest)["annotations"]
    assert notes[CP + "container-images"] == (
        f"main={pushed.container_images['main']},"
        f"sidecar={pushed.container_images['sidecar']}")
    assert CRIO_NAME not in notes
    assert (notes["org.criu.checkpoint.pod.name"],
            notes["org.criu.checkpoint.pod.namespace"]) == ("app", "default")
    layers = json.loads(pushed.manifest)["layers"]
    assert [layer["digest"] for layer in layers] == [
        digest_of(a.path.read_bytes()) for a in archives]
    repo = backend.repo()
    refs = await checkpoint_image_refs(backend.registry, repo, pushed.digest)
    assert refs == pushed.image_refs(repo) == {
        "main": f"{repo}@{pushed.container_images['main']}",
        "sidecar": f"{repo}@{pushed.container_images['sidecar']}"}


async def test_a_single_container_image_has_a_config_of_its_own(
        backend: Backend, tmp_path: Path) -> None:
    """CRI-O's image ID is the config digest and it caches manifest annotations by ID: the
    checkpoint image must never share its config with the pod-level manifest."""
    archive = Archive("main", cri_o_archive(tmp_path, "main", b"only"))
    pushed = await push_checkpoint(backend.registry, backend.repo(), "one", [archive],
                                   provenance())
    image = await backend.registry.get_manifest(backend.repo(), pushed.container_images["main"])
    assert json.loads(image.body)["config"]["digest"] != \
        json.loads(pushed.manifest)["config"]["digest"]


class Recording:
    """A registry that records what is pushed, in order."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    async def resolve(self, repository: str, reference: str) -> Resolved | None:
        return await self.inner.resolve(repository, reference)

    async def get_manifest(self, repository: str, reference: str) -> Manifest:
        return await self.inner.get_manifest(repository, reference)

    async def get_blob(self, repository: str, digest: str, dest: Path) -> int:
        return await self.inner.get_blob(repository, digest, dest)

    async def push_blob(self, repository: str, source: Path | bytes, *,
                        media_type: str = "application/octet-stream",
                        digest: str | None = None) -> Descriptor:
        kind = f"archive {source.name}" if isinstance(source, Path) else f"blob {media_type}"
        self.calls.append(("push_blob", kind))
        return await self.inner.push_blob(repository, source, media_type=media_type,
                                          digest=digest)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        self.calls.append(("push_manifest", str(tag)))
        return await self.inner.push_manifest(repository, body, media_type=media_type, tag=tag)

    async def delete_manifest(self, repository: str, digest: str) -> None:
        self.calls.append(("delete_manifest", digest))
        await self.inner.delete_manifest(repository, digest)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("backend", ["layout"], indirect=True)
async def test_images_are_pushed_before_the_tag_and_the_archive_only_once(
        backend: Backend, tmp_path: Path) -> None:
    """Archives, pod config, each image (config, manifest by its ``cpimage-`` tag), then
    the pod-level manifest under the requested tag, last: the tag never names a
    checkpoint whose images are missing; each archive is uploaded once."""
    recording = Recording(backend.registry)
    main = cri_o_archive(tmp_path, "main", b"m")
    side = cri_o_archive(tmp_path, "sidecar", b"s")
    pushed = await push_checkpoint(recording, backend.repo(), "ck-1",
                                   [Archive("main", main), Archive("sidecar", side)],
                                   provenance())
    images = pushed.container_images
    assert recording.calls == [
        ("push_blob", f"archive {main.name}"), ("push_blob", f"archive {side.name}"),
        ("push_blob", f"blob {OCI_CONFIG}"),
        ("push_blob", f"blob {OCI_CONFIG}"), ("push_manifest", "cpimage-" + images["main"][7:]),
        ("push_blob", f"blob {OCI_CONFIG}"),
        ("push_manifest", "cpimage-" + images["sidecar"][7:]),
        ("push_manifest", "ck-1")]


@pytest.mark.parametrize("backend", ["layout"], indirect=True)
@pytest.mark.parametrize("fmt", [criu.FORMAT, sim.FORMAT])
async def test_podman_and_simulator_checkpoints_get_no_images(
        backend: Backend, tmp_path: Path, fmt: str) -> None:
    """CRI-O cannot restore podman's archive (its spec.dump lacks CRI-O's annotations) nor
    the simulator's: one manifest, pushed as before, listing no images."""
    recording = Recording(backend.registry)
    pushed = await push_checkpoint(recording, backend.repo(), "ck-1",
                                   [Archive("main", cri_o_archive(tmp_path, "main", b"m"))],
                                   provenance(fmt, engine="podman"))
    assert pushed.container_images == {}
    assert [c for c in recording.calls if c[0] == "push_manifest"] == [("push_manifest", "ck-1")]
    notes = json.loads(pushed.manifest)["annotations"]
    assert CP + "container-images" not in notes
    assert CRIO_NAME not in notes
    assert notes[CRIU_NAME] == "main"
    assert await checkpoint_image_refs(backend.registry, backend.repo(), pushed.digest) == {}


def test_the_runtime_restores_the_kubelet_dumpers_format_only() -> None:
    """The table follows the dumpers' own format names, not a copy of them."""
    assert kubelet.FORMAT in RUNTIME_RESTORABLE_FORMATS
    assert criu.FORMAT not in RUNTIME_RESTORABLE_FORMATS
    assert sim.FORMAT not in RUNTIME_RESTORABLE_FORMATS


async def gone(b: Backend, reference: str) -> bool:
    return await b.registry.resolve(b.repo(), reference) is None


async def test_deleting_a_checkpoint_deletes_its_images_and_nothing_else(
        backend: Backend, tmp_path: Path) -> None:
    """The ``DeleteManifest`` action removes the pod-level manifest and every image it
    lists (by digest and by tag); another checkpoint in the repository keeps its own."""
    first, archives = await push_two(backend, tmp_path, tag="ck-1")
    second, _ = await push_two(backend, tmp_path, tag="ck-2", checkpoint_id="ck-2")
    handler = ManifestActions(backend.registry).handlers()["DeleteManifest"]
    await handler(delete_manifest("m/gc/1", repository=backend.repo(), digest=first.digest))
    assert await gone(backend, first.digest)
    assert await gone(backend, "ck-1")
    for image in first.container_images.values():
        assert await gone(backend, image)
        assert await gone(backend, "cpimage-" + image[7:])
    assert not await gone(backend, "ck-2")
    for image in second.container_images.values():
        assert not await gone(backend, image)
        assert not await gone(backend, "cpimage-" + image[7:])
    if backend.kind == "layout":  # the on-disk layout collects blobs at once
        with pytest.raises(RegistryNotFound):
            await backend.registry.get_blob(backend.repo(),
                                            digest_of(archives[0].path.read_bytes()),
                                            tmp_path / "gone.tar")
    await handler(delete_manifest("m/gc/2", repository=backend.repo(), digest=first.digest))


@pytest.mark.parametrize("backend", ["layout"], indirect=True)
async def test_an_interrupted_delete_is_finished_by_the_retry(
        backend: Backend, tmp_path: Path) -> None:
    """Images go before the manifest that lists them, so a delete cut short after some
    images is finished by the retried action (an image already gone is no error)."""
    pushed, _ = await push_two(backend, tmp_path)
    await backend.registry.delete_manifest(backend.repo(), pushed.container_images["main"])
    recording = Recording(backend.registry)
    handler = ManifestActions(recording).handlers()["DeleteManifest"]
    await handler(delete_manifest("m/gc/1", repository=backend.repo(), digest=pushed.digest))
    assert recording.calls[-1] == ("delete_manifest", pushed.digest)
    for reference in (pushed.digest, *pushed.container_images.values()):
        assert await gone(backend, reference)


# Today's (pre-container-images) pod-level manifest of a one-container kubelet checkpoint,
# as agents pushed it: CRI-O's key on the pod manifest, no container-images.
def todays_manifest(layer: bytes, config: Descriptor) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": OCI_LAYER, "digest": digest_of(layer), "size": len(layer),
                    "annotations": {CRIU_NAME: "main",
                                    "org.criu.checkpoint.rootfsImageName": "quay.io/app:1",
                                    "org.opencontainers.image.title": "main.tar"}}],
        "annotations": {
            CP + "checkpoint-id": "mig-1", CP + "source-pod-uid": "6f1c",
            CP + "node": "node-1", CP + "format": KUBELET, CP + "protocol-version": "v1",
            CP + "archive-bytes": str(len(layer)), CP + "containers": "main",
            CP + "pod": "default/app", CP + "dumper": "kubelet",
            "org.opencontainers.image.created": "2026-01-01T12:00:00Z",
            CRIO_NAME: "main", CRIU_NAME: "main",
            "org.criu.checkpoint.pod.name": "app",
            "org.criu.checkpoint.pod.namespace": "default",
            "org.criu.checkpoint.rootfsImageName": "quay.io/app:1"}},
        sort_keys=True, separators=(",", ":")).encode()


async def test_a_manifest_pushed_before_container_images_still_reads_and_deletes(
        backend: Backend, tmp_path: Path) -> None:
    """Stored checkpoints stay usable: read, pulled and deleted as before; they list no
    images (so a real node cannot restore them by itself, and nothing else is deleted)."""
    repo = backend.repo()
    path = cri_o_archive(tmp_path, "main", b"old")
    await backend.registry.push_blob(repo, path, media_type=OCI_LAYER)
    config = await backend.registry.push_blob(repo, b'{"os":"linux"}', media_type=OCI_CONFIG)
    body = todays_manifest(path.read_bytes(), config)
    digest = await backend.registry.push_manifest(repo, body, media_type=OCI_MANIFEST,
                                                  tag="old")
    artifact = read_checkpoint_manifest(body)
    assert (artifact.checkpoint_id, artifact.format) == ("mig-1", KUBELET)
    assert [(layer.container, layer.image) for layer in artifact.layers] == [
        ("main", "quay.io/app:1")]
    assert artifact.container_images == {}
    pulled = await pull_checkpoint(backend.registry, repo, digest, tmp_path / "pulled")
    assert pulled.files["main"].read_bytes() == path.read_bytes()
    assert await checkpoint_image_refs(backend.registry, repo, digest) == {}
    handler = ManifestActions(backend.registry).handlers()["DeleteManifest"]
    await handler(delete_manifest("m/gc/1", repository=repo, digest=digest))
    assert await gone(backend, digest)
