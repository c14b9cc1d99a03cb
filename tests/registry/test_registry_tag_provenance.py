"""What a tag proves, on both backends: stale tags, foreign images, a byte-exact round trip.

Gate 1 says a tag resolving is not enough: the manifest behind it must name this
checkpoint and this source pod. Pins, against the OCI layout and a real registry: a tag
still holding an earlier checkpoint is observed as that checkpoint (its digest, its
annotations) and :func:`~controlplane.machines.contract.protocol.provenance_problem` rejects it
for a later one; an image that is not a checkpoint at all (a plain OCI image, a Docker
image, an image index) is observed as a ``TagView`` that no checkpoint accepts, and the
agent's pull refuses it; a checkpoint comes back byte for byte (manifest and layer) and
is gone, by tag and by digest, once deleted.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.engine.observation import Interests, TagView
from controlplane.machines.contract import protocol
from drivers.registry import RegistryObserver
from drivers.registry.artifact import LAYER_TYPE, Provenance, read_checkpoint_manifest
from drivers.registry.checkpoints import Archive, pull_checkpoint, push_checkpoint
from drivers.registry.errors import RegistryBadResponse
from drivers.registry.port import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    Registry,
    sha256_digest,
)
from tests.registry.backends import Backend

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TAG = "default.app.latest"


def provenance(checkpoint_id: str, uid: str) -> Provenance:
    return Provenance(checkpoint_id=checkpoint_id, source_uid=uid, node="node-1",
                      namespace="default", pod="app", format="test-archive/v1",
                      dumper="test", created=CREATED)


def tar_archive(path: Path, payload: bytes) -> Path:
    """A real tar holding ``payload`` as ``checkpoint/pages-1.img``."""
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("checkpoint/pages-1.img")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return path


async def observe(backend: Backend, ref: str) -> TagView:
    seen = await RegistryObserver(backend.registry).observe(Interests(tags=frozenset({ref})))
    view = seen.tags[ref]
    assert isinstance(view, TagView), view
    return view


async def test_stale_tag_is_observed_as_the_earlier_checkpoint_and_fails_provenance(
        backend: Backend, tmp_path: Path) -> None:
    """Gate 1: a tag left by checkpoint A answers A's digest and annotations, and neither
    another checkpoint id nor another source pod UID accepts it; once B pushes under the
    same tag, the tag answers B (and A's manifest is still there by digest)."""
    repo = backend.repo()
    ref = f"{repo}:{TAG}"
    a = await push_checkpoint(backend.registry, repo, TAG,
                              [Archive("main", tar_archive(tmp_path / "a.tar", b"state A"))],
                              provenance("ck-a", "uid-a"))

    view = await observe(backend, ref)  # on behalf of checkpoint B: still A's artifact
    assert view.digest == a.digest
    assert view.annotations[protocol.MANIFEST_CHECKPOINT_ID] == "ck-a"
    assert view.annotations[protocol.MANIFEST_SOURCE_POD_UID] == "uid-a"
    assert protocol.provenance_problem(view, checkpoint_id="ck-b", source_uid="uid-b") == \
        "manifest names checkpoint 'ck-a', not 'ck-b'"
    # The same checkpoint id captured from a pod recreated under the same name.
    assert protocol.provenance_problem(view, checkpoint_id="ck-a", source_uid="uid-b") == \
        "manifest names source pod uid 'uid-a', not 'uid-b'"
    assert protocol.provenance_problem(view, checkpoint_id="ck-a", source_uid="uid-a") is None

    b = await push_checkpoint(backend.registry, repo, TAG,
                              [Archive("main", tar_archive(tmp_path / "b.tar", b"state B"))],
                              provenance("ck-b", "uid-b"))
    assert b.digest != a.digest
    moved = await observe(backend, ref)
    assert moved.digest == b.digest
    assert protocol.provenance_problem(moved, checkpoint_id="ck-b", source_uid="uid-b") is None
    assert protocol.provenance_problem(moved, checkpoint_id="ck-a", source_uid="uid-a")
    by_digest = await observe(backend, f"{repo}@{a.digest}")
    assert by_digest.annotations[protocol.MANIFEST_CHECKPOINT_ID] == "ck-a"


async def test_checkpoint_round_trips_byte_for_byte_and_is_absent_after_delete(
        backend: Backend, tmp_path: Path) -> None:
    """What is pushed is what is read back — the manifest's exact bytes (its digest is
    their sha256) and the layer's exact bytes — and after the delete neither the tag nor
    the digest resolves (``None``: a definite absence, not an error)."""
    repo = backend.repo()
    payload = bytes(range(256)) * 1024  # 256 KiB: several upload chunks on the registry
    path = tar_archive(tmp_path / "main.tar", payload)
    archive_bytes = path.read_bytes()
    pushed = await push_checkpoint(backend.registry, repo, TAG,
                                   [Archive("main", path, image="quay.io/app:1")],
                                   provenance("ck-1", "uid-1"))

    resolved = await backend.registry.resolve(repo, TAG)
    assert resolved is not None
    assert (resolved.digest, resolved.media_type) == (pushed.digest, OCI_MANIFEST)
    manifest = await backend.registry.get_manifest(repo, pushed.digest)
    assert manifest.body == pushed.manifest
    assert sha256_digest(manifest.body) == pushed.digest
    [layer] = read_checkpoint_manifest(manifest.body).layers
    assert layer.descriptor.media_type == LAYER_TYPE
    assert layer.descriptor.digest == sha256_digest(archive_bytes)
    assert layer.descriptor.size == len(archive_bytes) == pushed.archive_bytes
    size = await backend.registry.get_blob(repo, layer.descriptor.digest, tmp_path / "back")
    assert size == len(archive_bytes)
    assert (tmp_path / "back").read_bytes() == archive_bytes

    await backend.registry.delete_manifest(repo, pushed.digest)
    assert await backend.registry.resolve(repo, TAG) is None
    assert await backend.registry.resolve(repo, pushed.digest) is None
    refs = {f"{repo}:{TAG}", f"{repo}@{pushed.digest}"}
    seen = await RegistryObserver(backend.registry).observe(Interests(tags=frozenset(refs)))
    assert seen.tags == dict.fromkeys(refs)


# --- a tag that is not a checkpoint --------------------------------------------------------

async def _push_plain_image(registry: Registry, repo: str, *, docker: bool,
                            tag: str | None) -> str:
    """An ordinary single-layer image (gzip'd tar, no checkpoint annotations)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"app\n"))
    diff_id = sha256_digest(layer.getvalue())
    zipped = gzip.compress(layer.getvalue(), mtime=0)
    config_json = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                              "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    if docker:
        types = ("application/vnd.docker.container.image.v1+json",
                 "application/vnd.docker.image.rootfs.diff.tar.gzip", DOCKER_MANIFEST)
    else:
        types = ("application/vnd.oci.image.config.v1+json",
                 "application/vnd.oci.image.layer.v1.tar+gzip", OCI_MANIFEST)
    config = await registry.push_blob(repo, config_json, media_type=types[0])
    blob = await registry.push_blob(repo, zipped, media_type=types[1])
    manifest: dict[str, object] = {
        "schemaVersion": 2, "mediaType": types[2],
        "config": {"mediaType": types[0], "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": types[1], "digest": blob.digest, "size": blob.size}]}
    if not docker:  # OCI images carry annotations of their own, just not ours
        manifest["annotations"] = {"org.opencontainers.image.title": "app"}
    return await registry.push_manifest(repo, json.dumps(manifest).encode(),
                                        media_type=types[2], tag=tag)


async def _push_index(registry: Registry, repo: str, *, tag: str) -> str:
    """A multi-platform image: an OCI index over one plain image manifest."""
    image = await _push_plain_image(registry, repo, docker=False, tag=None)
    manifest = await registry.get_manifest(repo, image)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": image, "size": manifest.size,
         "platform": {"architecture": "amd64", "os": "linux"}}]}
    return await registry.push_manifest(repo, json.dumps(index).encode(),
                                        media_type=OCI_INDEX, tag=tag)


@pytest.mark.parametrize(("kind", "media_type", "pull_refusal"), [
    ("oci-image", OCI_MANIFEST, "not a checkpoint artifact: the manifest has no "
                                "checkpoint.controlplane.dev/format annotation"),
    ("docker-image", DOCKER_MANIFEST, "not a checkpoint image manifest: mediaType "
                                      f"'{DOCKER_MANIFEST}'"),
    ("oci-index", OCI_INDEX, f"not a checkpoint image manifest: mediaType '{OCI_INDEX}'"),
])
async def test_an_image_that_is_not_a_checkpoint_is_observed_but_never_accepted(
        backend: Backend, tmp_path: Path, kind: str, media_type: str,
        pull_refusal: str) -> None:
    """A tag holding someone else's image is a ``TagView`` (it exists: not absent, not an
    error), but with none of our provenance, so no checkpoint accepts it; the agent's
    pull refuses it as not being a checkpoint artifact."""
    repo = backend.repo()
    if kind == "oci-index":
        digest = await _push_index(backend.registry, repo, tag=TAG)
    else:
        digest = await _push_plain_image(backend.registry, repo, docker=kind == "docker-image",
                                         tag=TAG)

    resolved = await backend.registry.resolve(repo, TAG)
    assert resolved is not None
    assert (resolved.digest, resolved.media_type) == (digest, media_type)
    view = await observe(backend, f"{repo}:{TAG}")
    assert view.digest == digest
    assert not any(key.startswith(protocol.PREFIX) for key in view.annotations)
    problem = protocol.provenance_problem(view, checkpoint_id="ck-1", source_uid="uid-1")
    assert problem is not None
    assert "is not a checkpoint artifact" in problem
    with pytest.raises(RegistryBadResponse) as refused:
        await pull_checkpoint(backend.registry, repo, digest, tmp_path / "pulled")
    assert str(refused.value) == pull_refusal
