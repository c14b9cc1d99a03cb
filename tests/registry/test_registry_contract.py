"""The registry port's contract, run on both backends: the OCI layout and a real registry.

Every test here holds for :class:`~drivers.registry.layout.OciLayout` and for
:class:`~drivers.registry.client.RegistryClient` against Debian's distribution v2 on
loopback, so the embedded default and production behave alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from drivers.registry.client import RegistryClient
from drivers.registry.errors import RegistryError, RegistryNotFound, RegistryUnsupported
from drivers.registry.layout import OciLayout
from drivers.registry.port import OCI_MANIFEST, Descriptor
from tests.registry.backends import Backend

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"


async def push_image(b: Backend, repo: str, *, tag: str | None, payload: bytes,
                     annotations: dict[str, str]) -> tuple[str, bytes]:
    layer = await b.registry.push_blob(repo, payload, media_type=LAYER)
    config = await b.registry.push_blob(repo, b'{"architecture":"amd64","os":"linux"}',
                                        media_type=CONFIG)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": Descriptor(CONFIG, config.digest, config.size).to_json(),
                       "layers": [layer.to_json()], "annotations": annotations},
                      sort_keys=True).encode()
    digest = await b.registry.push_manifest(repo, body, media_type=OCI_MANIFEST, tag=tag)
    return digest, body


async def test_pushed_manifest_resolves_by_tag_and_digest_with_its_annotations(
        backend: Backend) -> None:
    repo = backend.repo()
    digest, body = await push_image(backend, repo, tag="ckpt-1", payload=b"state",
                                    annotations={"a": "1", "b": "two"})
    assert digest == "sha256:" + hashlib.sha256(body).hexdigest()
    by_tag = await backend.registry.resolve(repo, "ckpt-1")
    by_digest = await backend.registry.resolve(repo, digest)
    assert by_tag is not None
    assert by_digest is not None
    assert by_tag.digest == by_digest.digest == digest
    assert dict(by_tag.annotations) == dict(by_digest.annotations) == {"a": "1", "b": "two"}
    manifest = await backend.registry.get_manifest(repo, "ckpt-1")
    assert manifest.body == body
    assert manifest.media_type == OCI_MANIFEST


async def test_unknown_tag_digest_and_repository_resolve_to_absent(backend: Backend) -> None:
    repo = backend.repo()
    await push_image(backend, repo, tag="present", payload=b"x", annotations={})
    assert await backend.registry.resolve(repo, "missing") is None
    assert await backend.registry.resolve(repo, "sha256:" + "0" * 64) is None
    assert await backend.registry.resolve(backend.repo("never/pushed"), "t") is None
    with pytest.raises(RegistryNotFound):
        await backend.registry.get_manifest(repo, "missing")


async def test_blobs_round_trip_monolithic_and_chunked(backend: Backend, tmp_path: Path) -> None:
    """A blob larger than the chunk size goes up in PATCH chunks (HTTP) and comes back whole."""
    repo = backend.repo()
    big = bytes(range(256)) * 1024 + b"tail"  # 256 KiB + 4: five chunks of 64 KiB
    source = tmp_path / "big.tar"
    source.write_bytes(big)
    small = await backend.registry.push_blob(repo, b"small")
    large = await backend.registry.push_blob(repo, source)
    assert large.size == len(big)
    assert large.digest == "sha256:" + hashlib.sha256(big).hexdigest()
    again = await backend.registry.push_blob(repo, source)  # already there: skipped
    assert again == large
    if isinstance(backend.registry, RegistryClient):
        assert backend.registry.transport.sent["PATCH"] == 5  # 64 KiB chunks (conftest)
    out = tmp_path / "out"
    out.mkdir()
    assert await backend.registry.get_blob(repo, large.digest, out / "large") == len(big)
    assert (out / "large").read_bytes() == big
    await backend.registry.get_blob(repo, small.digest, out / "small")
    assert (out / "small").read_bytes() == b"small"
    assert sorted(p.name for p in out.iterdir()) == ["large", "small"]  # no partial files
    with pytest.raises(RegistryNotFound):
        await backend.registry.get_blob(repo, "sha256:" + "1" * 64, out / "none")


async def test_a_blob_pushed_with_its_known_digest_lands_and_a_wrong_one_fails(
        backend: Backend, tmp_path: Path) -> None:
    """The caller's digest (a sealed layer's) spares a second read, never the check."""
    repo = backend.repo()
    source = tmp_path / "sealed"
    source.write_bytes(b"ciphertext" * 1000)
    digest = "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    pushed = await backend.registry.push_blob(repo, source, digest=digest)
    assert (pushed.digest, pushed.size) == (digest, 10000)
    out = tmp_path / "out"
    assert await backend.registry.get_blob(repo, digest, out) == 10000
    other = tmp_path / "other"
    other.write_bytes(b"not the same bytes")
    with pytest.raises(RegistryError):
        await backend.registry.push_blob(repo, other, digest="sha256:" + "2" * 64)
    with pytest.raises(RegistryNotFound):
        await backend.registry.get_blob(repo, "sha256:" + "2" * 64, tmp_path / "none")


async def test_a_digest_that_is_not_64_hex_digits_never_becomes_a_path_or_a_url(
        backend: Backend, tmp_path: Path) -> None:
    """A digest read from a manifest someone else pushed reaches get_blob: ``../`` in it
    must not walk out of the layout (or into another URL)."""
    (tmp_path / "secret").write_bytes(b"outside the registry")
    sneaky = "sha256:" + ("../" * 21 + "s")[:64]
    assert len(sneaky) == 71
    with pytest.raises(RegistryError):
        await backend.registry.get_blob(backend.repo(), sneaky, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(RegistryError):
        await backend.registry.push_blob(backend.repo(), tmp_path / "secret", digest=sneaky)


async def test_deleted_manifest_is_absent_by_tag_and_by_digest(backend: Backend) -> None:
    repo = backend.repo()
    digest, _ = await push_image(backend, repo, tag="gc-me", payload=b"old", annotations={})
    await backend.registry.delete_manifest(repo, digest)
    assert await backend.registry.resolve(repo, digest) is None
    assert await backend.registry.resolve(repo, "gc-me") is None
    with pytest.raises(RegistryNotFound):
        await backend.registry.delete_manifest(repo, digest)


async def test_delete_of_a_manifest_never_pushed_is_not_found(backend: Backend) -> None:
    repo = backend.repo()
    await push_image(backend, repo, tag="other", payload=b"o", annotations={})
    with pytest.raises(RegistryNotFound):
        await backend.registry.delete_manifest(repo, "sha256:" + "a" * 64)


async def test_a_moved_tag_leaves_the_old_manifest_resolvable_by_digest(
        backend: Backend) -> None:
    """Restores pin artifacts by digest: re-pushing a tag must not lose what it named."""
    repo = backend.repo()
    first, _ = await push_image(backend, repo, tag="t", payload=b"one", annotations={"n": "1"})
    second, _ = await push_image(backend, repo, tag="t", payload=b"two", annotations={"n": "2"})
    assert first != second
    now = await backend.registry.resolve(repo, "t")
    old = await backend.registry.resolve(repo, first)
    assert now is not None
    assert now.digest == second
    assert old is not None
    assert old.annotations["n"] == "1"


async def test_concurrent_pushes_to_one_repository_all_land(backend: Backend) -> None:
    repo = backend.repo()
    results = await asyncio.gather(*(
        push_image(backend, repo, tag=f"c{i}", payload=f"p{i}".encode(),
                   annotations={"i": str(i)}) for i in range(8)))
    for i, (digest, _) in enumerate(results):
        resolved = await backend.registry.resolve(repo, f"c{i}")
        assert resolved is not None
        assert (resolved.digest, resolved.annotations["i"]) == (digest, str(i))


async def test_delete_refused_by_the_registry_is_typed_unsupported(
        refusing_backend: Backend) -> None:
    b = refusing_backend
    repo = b.repo()
    digest, _ = await push_image(b, repo, tag="keep", payload=b"k", annotations={})
    with pytest.raises(RegistryUnsupported) as caught:
        await b.registry.delete_manifest(repo, digest)
    assert caught.value.status == 405
    assert not caught.value.retryable
    assert await b.registry.resolve(repo, "keep") is not None


async def test_the_tags_of_a_repository_are_listed_sorted_and_an_unknown_one_has_none(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    import drivers.registry.client as client_module

    monkeypatch.setattr(client_module, "TAGS_PAGE", 2)  # the real registry pages: 3 pages
    repo = backend.repo()
    for n in (3, 1, 5, 2, 4):
        await push_image(backend, repo, tag=f"ckpt-{n}", payload=b"state %d" % n,
                         annotations={"n": str(n)})
    lister = backend.registry
    assert isinstance(lister, (RegistryClient, OciLayout))
    assert await lister.list_tags(repo) == [f"ckpt-{n}" for n in range(1, 6)]
    assert await lister.list_tags(backend.repo("checkpoints/never-pushed")) == []
