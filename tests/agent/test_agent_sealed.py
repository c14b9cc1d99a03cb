"""Sealed checkpoints through the node agents (simulator + on-disk registry): what is
pushed is ciphertext, signed; what is restored is only ours, each refusal with its reason.

The keys are as an install has them: one signing key for every agent, the restore side
trusting its public key, and a recipient key pair for the sealed class.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from controlplane.engine.observation import TagView
from controlplane.machines.contract import protocol
from drivers.agent.sealing import Sealing, SealingSettings
from drivers.registry.artifact import SEALED_FOR, Provenance
from drivers.registry.checkpoints import Archive, push_checkpoint
from drivers.registry.layout import OciLayout
from drivers.registry.observer import RegistryObserver
from drivers.sealing import signatures
from tests.agent.test_agent_restore import restore_pod, restored
from tests.agent.world import World, open_world

NS = "default"
SECRET = "counter=4242-only-in-memory"


def write_pair(where: Path, name: str) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    (where / f"{name}.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (where / f"{name}.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return where / f"{name}.pem"


@dataclass
class Keys:
    dir: Path

    def pub(self, name: str) -> str:
        return f"file:{self.dir / name}.pub"

    def pem(self, name: str) -> str:
        return f"file:{self.dir / name}.pem"


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    where = tmp_path / "keys"
    where.mkdir()
    for name in ("signing", "attacker", "old", "new"):
        write_pair(where, name)
    return Keys(where)


@pytest.fixture
async def sealed_world(tmp_path: Path, keys: Keys) -> AsyncIterator[World]:
    settings = SealingSettings(signing_key=keys.dir / "signing.pem",
                               trusted_keys=(keys.dir / "signing.pub",),
                               decryption_keys=(keys.dir / "old.pem",))
    sealing = {node: Sealing.load(settings) for node in ("node-1", "node-2")}
    async with open_world(tmp_path, sealing=sealing) as w:
        yield w


def seal(checkpoint_id: str, *recipients: str, required: bool = True) -> dict[str, str]:
    return {protocol.CAPTURE_SEAL: json.dumps({"checkpoint": checkpoint_id,
                                               "recipients": list(recipients),
                                               "required": required})}


async def sealed_capture(w: World, name: str, checkpoint_id: str, *recipients: str) -> str:
    w.cluster.create_pod(NS, name, node="node-1", marker=SECRET)
    await w.running(NS, name)
    w.request_capture(NS, name, checkpoint_id, quiesce=True,
                      extra=seal(checkpoint_id, *recipients))
    assert await w.report(NS, name, "Pushed", "Failed") == "Pushed", w.annotations(NS, name)
    return w.annotations(NS, name)[protocol.REPORT_DIGEST]


def registry_files(w: World) -> list[Path]:
    assert isinstance(w.backend.registry, OciLayout)
    return [p for p in w.backend.registry.root.rglob("*") if p.is_file()]


async def test_a_sealed_checkpoint_is_ciphertext_at_rest_and_restores_with_its_key(
        sealed_world: World, keys: Keys) -> None:
    w = sealed_world
    digest = await sealed_capture(w, "app", "ck-1", keys.pub("new"))
    manifest = json.loads((await w.backend.registry.get_manifest(w.repo, digest)).body)
    assert {layer["mediaType"] for layer in manifest["layers"]} == {
        "application/vnd.oci.image.layer.v1.tar+encrypted"}
    assert manifest["annotations"][SEALED_FOR]
    assert "Pushed" in w.states_seen(NS, "app")
    assert "sealed for" in w.annotations(NS, "app")[protocol.REPORT_REASON]
    for path in registry_files(w):
        assert SECRET.encode() not in path.read_bytes(), path

    restore_pod(w, "app-r1", digest=digest, checkpoint_id="ck-1",
                extra={protocol.RESTORE_UNSEAL: keys.pem("new")})
    notes = await restored(w, "app-r1")
    assert notes.get(protocol.RESTORE_FAILURE) is None
    assert notes["sim.controlplane.dev/marker"] == SECRET


async def test_a_checkpoint_sealed_for_a_rotated_out_key_still_restores_while_the_node_keeps_it(
        sealed_world: World, keys: Keys) -> None:
    """Sealed for the old key; the class now names the new one: the node's kept old key
    (``--decryption-key``) still opens it. A node with neither key refuses, naming why."""
    w = sealed_world
    digest = await sealed_capture(w, "app", "ck-old", keys.pub("old"))
    restore_pod(w, "r-old", digest=digest, checkpoint_id="ck-old",
                extra={protocol.RESTORE_UNSEAL: keys.pem("new")})
    notes = await restored(w, "r-old")
    assert notes.get(protocol.RESTORE_FAILURE) is None
    assert notes["sim.controlplane.dev/marker"] == SECRET

    other = await sealed_capture(w, "app2", "ck-att", keys.pub("attacker"))
    restore_pod(w, "r-att", digest=other, checkpoint_id="ck-att",
                extra={protocol.RESTORE_UNSEAL: keys.pem("new")})
    failure = (await restored(w, "r-att"))[protocol.RESTORE_FAILURE]
    assert "Unsealable" in failure
    assert "NotForUs" in failure


async def test_a_required_seal_without_its_key_refuses_the_capture_and_pushes_nothing(
        sealed_world: World) -> None:
    w = sealed_world
    w.cluster.create_pod(NS, "app", node="node-1", marker=SECRET)
    await w.running(NS, name := "app")
    w.request_capture(NS, name, "ck-1", quiesce=True,
                      extra=seal("ck-1", "secret:missing-secret/public.pem"))
    assert await w.report(NS, name, "Pushed", "Failed") == "Failed"
    reason = w.annotations(NS, name)[protocol.REPORT_REASON]
    assert "requires sealed checkpoints" in reason
    assert "nothing is pushed in plain text" in reason
    assert await w.backend.registry.resolve(w.repo, "ck-1") is None
    assert w.dumpers["node-1"].dumps == 0


async def forged_push(w: World, tmp_path: Path, tag: str) -> str:
    """What an attacker with push rights does: a checkpoint with the right annotations."""
    archive = tmp_path / "forged.tar"
    archive.write_bytes(b"not the workload")
    prov = Provenance(checkpoint_id="ck-1", source_uid=w.uid(NS, "app"), node="node-1",
                      namespace=NS, pod="app", format="sim-marker/v1", dumper="sim",
                      created=datetime(2026, 11, 26, tzinfo=UTC))
    pushed = await push_checkpoint(w.backend.registry, w.repo, tag,
                                   [Archive("main", archive)], prov)
    return pushed.digest


async def refusal(w: World, name: str, digest: str) -> str:
    restore_pod(w, name, digest=digest, checkpoint_id="ck-1")
    notes = await restored(w, name)
    assert "sim.controlplane.dev/marker" not in notes
    return notes[protocol.RESTORE_FAILURE]


async def test_forged_resigned_and_copied_signatures_are_never_restored(
        sealed_world: World, keys: Keys, tmp_path: Path) -> None:
    w = sealed_world
    real = await sealed_capture(w, "app", "ck-1", keys.pub("new"))

    unsigned = await forged_push(w, tmp_path, "ck-1")  # a forged push under the right tag
    assert "Unsigned" in await refusal(w, "r-unsigned", unsigned)

    attacker = signatures.Signer.from_pem((keys.dir / "attacker.pem").read_bytes())
    resigned = await forged_push(w, tmp_path, "forged-2")
    await signatures.sign_manifest(w.backend.registry, w.repo, resigned, attacker)
    assert "UntrustedSignature" in await refusal(w, "r-resigned", resigned)

    copied = await forged_push(w, tmp_path, "forged-3")  # the real signature, copied over
    ours = await w.backend.registry.get_manifest(w.repo, signatures.signature_tag(real))
    await w.backend.registry.push_manifest(w.repo, ours.body, media_type=ours.media_type,
                                           tag=signatures.signature_tag(copied))
    assert "DigestMismatch" in await refusal(w, "r-copied", copied)


async def test_a_swapped_layer_blob_is_refused_before_anything_is_restored(
        sealed_world: World, keys: Keys) -> None:
    w = sealed_world
    digest = await sealed_capture(w, "app", "ck-1", keys.pub("new"))
    manifest = json.loads((await w.backend.registry.get_manifest(w.repo, digest)).body)
    layer = manifest["layers"][0]["digest"].removeprefix("sha256:")
    [blob] = [p for p in registry_files(w) if p.name == layer]
    blob.write_bytes(blob.read_bytes()[::-1])  # same name, same size, other bytes
    failure = await refusal(w, "r-swapped", digest)
    assert f"content does not match sha256:{layer}" in failure


async def test_the_workers_observer_says_which_tags_a_trusted_key_signed(
        sealed_world: World, keys: Keys, tmp_path: Path) -> None:
    """What the capture step pins from (``--trusted-key`` on the worker): the agent's
    signed push verifies; a forged push under a tag, with the right annotations, does not;
    a manifest that is not a checkpoint is not checked at all."""
    w = sealed_world
    verifier = signatures.Verifier.from_pems([(keys.dir / "signing.pub").read_bytes()])
    observer = RegistryObserver(w.backend.registry, verifier=verifier)
    await sealed_capture(w, "app", "ck-1", keys.pub("new"))
    ours = await observer.tag(f"{w.repo}:ck-1")
    assert isinstance(ours, TagView)
    assert ours.signature == "verified"
    assert protocol.provenance_problem(ours, checkpoint_id="ck-1",
                                       source_uid=w.uid(NS, "app")) is None

    await forged_push(w, tmp_path, "ck-1")
    forged = await observer.tag(f"{w.repo}:ck-1")
    assert isinstance(forged, TagView)
    assert forged.signature.startswith("refused: Unsigned")
    problem = protocol.provenance_problem(forged, checkpoint_id="ck-1",
                                          source_uid=w.uid(NS, "app"))
    assert problem is not None
    assert "signature did not verify" in problem
