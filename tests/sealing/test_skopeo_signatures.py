"""Our manifest signatures are containers/image's own: Debian's skopeo reads and checks them.

Through a real registry (Debian's docker-registry on loopback) and Debian's skopeo
(``use-sigstore-attachments: true`` in its registries.d). skopeo is never skipped:
missing, it FAILS, naming ``scripts/ensure-skopeo``.

Debian bookworm's skopeo 1.9.3 reads sigstore attachments but its containers/image is
patched to refuse every signature a ``sigstoreSigned`` requirement checks ("Debian-local
change: sigstore disabled"; it has no sigstore library). So these pin what it can show:

- ``skopeo copy`` fetches our ``sha256-<hex>.sig`` attachment and hands back each layer as
  its own sigstore signature (``dir:``'s ``signature-N``: MIME type, payload, annotations),
  byte for byte, and ``openssl`` verifies the signature over that payload with our
  public key (what sigstore's ECDSA verifier does: SHA-256, ASN.1 DER);
- under a policy requiring ``sigstoreSigned`` with our key, an unsigned image is refused
  for having no signature, and our signed one reaches the signature check (accepted by a
  containers/image with sigstore, refused by Debian's stub); without
  ``use-sigstore-attachments`` skopeo sees no signature at all. Where skopeo can check,
  another key's signature and our signature copied onto another manifest are refused.

(The reverse, skopeo's ``--sign-by-sigstore-private-key``, is stubbed out in Debian too,
and needs a cosign-encrypted key; not pinned here.)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from drivers.registry import RegistryClient, RegistrySettings
from drivers.sealing.signatures import (
    PAYLOAD_TYPE,
    SIGNATURE_ANNOTATION,
    Signer,
    Verifier,
    payload,
    sign_manifest,
    signature_tag,
)
from tests.registry.servers import run_registry
from tests.sealing.parties import party
from tests.sealing.tools import push_image, run

ENSURE = "scripts/ensure-skopeo"
OURS, ATTACKER = party("signing"), party("attacker")
DEBIAN_STUB = "Debian-local change: sigstore disabled"
NO_SIGNATURE = "A signature was required, but no signature exists"
SIGSTORE_JSON = b"\0sigstore-json\n"  # containers/image's signature.Blob of a sigstore one


@dataclass
class World:
    host: str
    client: RegistryClient
    home: Path
    env: dict[str, str]

    def policy(self, requirement: dict[str, Any]) -> Path:
        """A policy that rejects everything but this registry's images meeting it."""
        path = self.home / f"policy-{len(list(self.home.glob('policy-*')))}.json"
        path.write_text(json.dumps({"default": [{"type": "reject"}],
                                    "transports": {"docker": {self.host: [requirement]}}}))
        return path

    def signed_by_ours(self, identity: dict[str, str] | None = None) -> Path:
        requirement: dict[str, Any] = {"type": "sigstoreSigned",
                                       "keyPath": str(self.home / "ours.pub")}
        if identity is not None:
            requirement["signedIdentity"] = identity
        return self.policy(requirement)

    async def copy(self, policy: Path, repo: str, digest: str, *,
                   attachments: bool = True) -> tuple[int, str, Path]:
        """``skopeo copy docker://REPO@DIGEST dir:OUT``: exit code, output and OUT."""
        out = self.home / "out" / f"{policy.stem}-{digest[7:19]}-{attachments}"
        registries_d = self.home / ("registries.d" if attachments else "plain.d")
        code, said = await run(
            "skopeo", "--policy", str(policy), "--registries.d", str(registries_d), "copy",
            "--src-tls-verify=false", f"docker://{repo}@{digest}", f"dir:{out}", env=self.env)
        return code, said, out

    async def push_image(self, repo: str, name: str) -> str:
        return await push_image(self.client, repo, name)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    if shutil.which("skopeo") is None:
        pytest.fail(f"skopeo is missing: run {ENSURE} (it installs Debian's skopeo); the "
                    "interoperability tests are never skipped", pytrace=False)
    home = tmp_path / "skopeo"
    for folder in ("tmp", "out", "registries.d", "plain.d"):
        (home / folder).mkdir(parents=True)
    (home / "auth.json").write_text(json.dumps({"auths": {}}))
    (home / "registries.conf").write_text("")
    OURS.write(home, "ours")
    ATTACKER.write(home, "attacker")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "TMPDIR": str(home / "tmp"), "REGISTRY_AUTH_FILE": str(home / "auth.json"),
           "CONTAINERS_REGISTRIES_CONF": str(home / "registries.conf")}
    async with run_registry(tmp_path / "registry", delete=True) as server:
        (home / "registries.d" / "sigstore.yaml").write_text(
            f"docker:\n  {server.host}:\n    use-sigstore-attachments: true\n")
        client = RegistryClient(RegistrySettings(request_timeout=10, attempts=1))
        try:
            yield World(server.host, client, home, env)
        finally:
            await client.close()


def read_signature(path: Path) -> dict[str, Any]:
    """A ``dir:`` signature file as containers/image wrote it: format, then its JSON."""
    blob = path.read_bytes()
    assert blob.startswith(SIGSTORE_JSON), blob[:32]
    found: dict[str, Any] = json.loads(blob[len(SIGSTORE_JSON):])
    return found


async def test_skopeo_reads_each_of_our_signatures_as_its_own_and_openssl_verifies_ours(
        world: World) -> None:
    repo = f"{world.host}/checkpoints/app"
    digest = await world.push_image(repo, "ck-1")
    await sign_manifest(world.client, repo, digest, Signer(OURS.private))
    await sign_manifest(world.client, repo, digest, Signer(ATTACKER.private))

    code, said, out = await world.copy(world.policy({"type": "insecureAcceptAnything"}),
                                       repo, digest)
    assert code == 0, said
    copied = [read_signature(out / f"signature-{n}") for n in (1, 2)]
    assert not (out / "signature-3").exists()
    body = payload(f"{repo}@{digest}", digest)
    for index, (signature, key) in enumerate(zip(copied, ("ours", "attacker"), strict=True)):
        assert signature["mimeType"] == PAYLOAD_TYPE
        assert base64.b64decode(signature["payload"]) == body
        raw = base64.b64decode(signature["annotations"][SIGNATURE_ANNOTATION])
        (world.home / f"payload-{index}").write_bytes(body)
        (world.home / f"signature-{index}.der").write_bytes(raw)
        for pub, expected in (("ours", key == "ours"), ("attacker", key == "attacker")):
            code, said = await run(
                "openssl", "dgst", "-sha256", "-verify", str(world.home / f"{pub}.pub"),
                "-signature", str(world.home / f"signature-{index}.der"),
                str(world.home / f"payload-{index}"), env=world.env)
            assert (code == 0) is expected, said
        assert Verifier([OURS.public]).verify(body, raw) is (key == "ours")


async def test_a_sigstore_policy_finds_our_signature_and_refuses_what_is_not_ours(
        world: World) -> None:
    repo = f"{world.host}/checkpoints/app"
    signed = await world.push_image(repo, "signed")
    await sign_manifest(world.client, repo, signed, Signer(OURS.private))

    # Ours, under the default identity rule (matchRepoDigestOrExact: why we sign REPO@DIGEST)
    # and matchRepository: accepted, or Debian's stub refuses it at the signature check.
    for identity in (None, {"type": "matchRepository"}):
        code, said, _ = await world.copy(world.signed_by_ours(identity), repo, signed)
        assert code == 0 or DEBIAN_STUB in said, said
    stubbed = DEBIAN_STUB in said
    policy = world.signed_by_ours({"type": "matchRepository"})

    code, said, out = await world.copy(policy, repo, signed, attachments=False)
    assert code != 0
    assert NO_SIGNATURE in said  # registries.d's use-sigstore-attachments is needed
    assert not (out / "manifest.json").exists()

    unsigned = await world.push_image(repo, "unsigned")
    code, said, out = await world.copy(policy, repo, unsigned)
    assert code != 0
    assert NO_SIGNATURE in said
    assert not (out / "manifest.json").exists()

    resigned = await world.push_image(repo, "resigned")
    await sign_manifest(world.client, repo, resigned, Signer(ATTACKER.private))
    real = await world.push_image(repo, "real")
    forged = await world.push_image(repo, "forged")
    await sign_manifest(world.client, repo, real, Signer(OURS.private))
    ours = await world.client.get_manifest(repo, signature_tag(real))
    await world.client.push_manifest(repo, ours.body, media_type=ours.media_type,
                                     tag=signature_tag(forged))
    for refused, reason in ((resigned, "cryptographic signature verification failed"),
                            (forged, f"Signature for digest {real} does not match")):
        code, said, out = await world.copy(policy, repo, refused)
        assert code != 0
        assert (DEBIAN_STUB if stubbed else reason) in said
        assert not (out / "manifest.json").exists()
