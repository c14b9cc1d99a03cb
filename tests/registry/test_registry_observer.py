"""The registry as the machines see it: observations, the GC action, checkpoint artifacts.

Run on both backends (the OCI layout and a real registry). Pins: a tag or digest the
machines ask about comes back with the manifest's annotations (gate 1's provenance), a
definite 404 is ``None``, and anything else is a ``ProbeError`` — never "absent" (gate 3);
``DeleteManifest`` is idempotent (404 = done) and a refused delete is terminal (gate 7).
"""

from __future__ import annotations

import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, ProbeError, TagView
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import delete_manifest
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from drivers.registry import ManifestActions, RegistryClient, RegistryObserver
from drivers.registry.artifact import CRIO_CHECKPOINT_NAME, CRIU_CONTAINER_NAME, Provenance
from drivers.registry.checkpoints import Archive, pull_checkpoint, push_checkpoint
from tests.registry.backends import FAST, Backend

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def provenance(checkpoint_id: str = "ck-1", uid: str = "uid-1") -> Provenance:
    return Provenance(checkpoint_id=checkpoint_id, source_uid=uid, node="node-1",
                      namespace="default", pod="app", format="test-archive/v1",
                      dumper="test", created=CREATED)


def archive(tmp_path: Path, name: str, content: bytes) -> Path:
    src = tmp_path / f"{name}.payload"
    src.write_bytes(content)
    out = tmp_path / f"{name}.tar"
    with tarfile.open(out, "w") as tar:
        tar.add(src, arcname="state")
    return out


async def test_checkpoint_pushed_to_a_tag_is_observed_with_its_provenance(
        backend: Backend, tmp_path: Path) -> None:
    repo = backend.repo()
    pushed = await push_checkpoint(backend.registry, repo, "default.app.ck-1",
                                   [Archive("main", archive(tmp_path, "main", b"m"),
                                            image="registry.k8s.io/pause:3.9")],
                                   provenance())
    observer = RegistryObserver(backend.registry)
    tag_ref, digest_ref = f"{repo}:default.app.ck-1", f"{repo}@{pushed.digest}"
    seen = await observer.observe(Interests(tags=frozenset({tag_ref, digest_ref})))
    by_tag, by_digest = seen.tags[tag_ref], seen.tags[digest_ref]
    assert isinstance(by_tag, TagView)
    assert isinstance(by_digest, TagView)
    assert by_tag.digest == by_digest.digest == pushed.digest
    assert protocol.provenance_problem(by_tag, checkpoint_id="ck-1", source_uid="uid-1") is None
    assert protocol.provenance_problem(by_tag, checkpoint_id="ck-2", source_uid="uid-1")
    notes = by_tag.annotations
    assert notes[protocol.MANIFEST_NODE] == "node-1"
    assert notes[protocol.MANIFEST_FORMAT] == "test-archive/v1"
    assert notes[protocol.MANIFEST_PROTOCOL] == protocol.PROTOCOL_VERSION
    assert notes[CRIU_CONTAINER_NAME] == "main"
    assert CRIO_CHECKPOINT_NAME not in notes  # only a per-container checkpoint image has it
    assert int(notes["checkpoint.controlplane.dev/archive-bytes"]) == pushed.archive_bytes


async def test_checkpoint_pulls_back_by_digest_with_every_container(
        backend: Backend, tmp_path: Path) -> None:
    repo = backend.repo()
    archives = [Archive("main", archive(tmp_path, "main", b"main state")),
                Archive("sidecar", archive(tmp_path, "side", b"side state"))]
    pushed = await push_checkpoint(backend.registry, repo, "two", archives, provenance())
    pulled = await pull_checkpoint(backend.registry, repo, pushed.digest, tmp_path / "pulled")
    assert sorted(pulled.files) == ["main", "sidecar"]
    for a in archives:
        assert pulled.files[a.container].read_bytes() == a.path.read_bytes()
    assert pulled.artifact.checkpoint_id == "ck-1"
    assert CRIO_CHECKPOINT_NAME not in pulled.artifact.annotations  # two containers


async def test_absent_and_malformed_references_are_none_and_probe_errors(
        backend: Backend) -> None:
    repo = backend.repo()
    observer = RegistryObserver(backend.registry)
    asked = {f"{repo}:nope", f"{repo}@sha256:{'e' * 64}", "not a reference"}
    seen = await observer.observe(Interests(tags=frozenset(asked)))
    assert seen.tags[f"{repo}:nope"] is None
    assert seen.tags[f"{repo}@sha256:{'e' * 64}"] is None
    bad = seen.tags["not a reference"]
    assert isinstance(bad, ProbeError)
    assert not bad.retryable


async def test_delete_manifest_action_is_idempotent(backend: Backend, tmp_path: Path) -> None:
    repo = backend.repo()
    pushed = await push_checkpoint(backend.registry, repo, "gc",
                                   [Archive("main", archive(tmp_path, "main", b"x"))],
                                   provenance())
    handler = ManifestActions(backend.registry).handlers()["DeleteManifest"]
    action = delete_manifest("m/gc/1", repository=repo, digest=pushed.digest)
    await handler(action)
    assert await backend.registry.resolve(repo, pushed.digest) is None
    await handler(action)  # 404: already done


async def test_delete_manifest_refused_by_the_registry_is_terminal(
        refusing_backend: Backend, tmp_path: Path) -> None:
    """Gate 7: a registry that will not delete makes a visible, terminal ActionFailed."""
    b = refusing_backend
    repo = b.repo()
    pushed = await push_checkpoint(b.registry, repo, "kept",
                                   [Archive("main", archive(tmp_path, "main", b"x"))],
                                   provenance())
    handler = ManifestActions(b.registry).handlers()["DeleteManifest"]
    with pytest.raises(TerminalActionError) as caught:
        await handler(delete_manifest("m/gc/1", repository=repo, digest=pushed.digest))
    assert caught.value.error_class == "MethodNotAllowed"
    assert isinstance(caught.value.__cause__, Exception)
    assert await b.registry.resolve(repo, pushed.digest) is not None


async def test_malformed_delete_params_are_terminal(backend: Backend) -> None:
    handler = ManifestActions(backend.registry).handlers()["DeleteManifest"]
    with pytest.raises(TerminalActionError):
        await handler(Action("DeleteManifest", "k", {"repository": backend.repo(),
                                                     "digest": "latest"}))


async def test_unreachable_registry_is_a_retryable_probe_error_never_absent(
        tmp_path: Path) -> None:
    """Gate 3: nothing listens on the port -> ProbeError, and the GC action retries."""
    client = RegistryClient(FAST)
    try:
        repo = "127.0.0.1:9/checkpoints/app"  # the discard port: connection refused
        seen = await RegistryObserver(client).observe(
            Interests(tags=frozenset({f"{repo}:t"})))
        fact = seen.tags[f"{repo}:t"]
        assert isinstance(fact, ProbeError)
        assert fact.retryable
        assert fact.error_class == "Unreachable"
        with pytest.raises(RetryableActionError):
            await ManifestActions(client).handlers()["DeleteManifest"](
                delete_manifest("k", repository=repo, digest="sha256:" + "0" * 64))
    finally:
        await client.close()
