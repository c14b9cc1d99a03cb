"""Signatures on checkpoint manifests, on the on-disk registry: what a restore accepts.

Pins: a manifest signed by a trusted key verifies; unsigned, re-signed by another key, or
carrying a trusted signature of another manifest (copied onto a forged push) is refused,
each with its own :class:`~drivers.sealing.signatures.SignatureRefused`; a second
signature keeps the first; a verifier trusting the old and the new key accepts both
while the signing key rotates. The payload and the attachment are containers/image's
(that skopeo reads them is pinned by ``test_skopeo_signatures.py``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from drivers.registry import OciLayout
from drivers.registry.port import OCI_MANIFEST, Descriptor
from drivers.sealing.signatures import (
    PAYLOAD_TYPE,
    SIGNATURE_ANNOTATION,
    DigestMismatch,
    Signer,
    Unsigned,
    UntrustedSignature,
    Verified,
    Verifier,
    payload,
    sign_manifest,
    signature_tag,
    verify_manifest,
)
from tests.sealing.parties import party
from tests.sealing.tools import OCI_CONFIG, push_image

REPO = "localhost:5000/checkpoints/app"
OURS, NEW, ATTACKER = party("signing"), party("signing-new"), party("attacker")


def signer(who: str) -> Signer:
    return Signer(party(who).private)


@pytest.fixture
def registry(tmp_path: Path) -> OciLayout:
    return OciLayout(tmp_path / "oci", allow_delete=True, gc_grace=0)


async def attachment(registry: OciLayout, digest: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(
        (await registry.get_manifest(REPO, signature_tag(digest))).body)
    return manifest


def blob(registry: OciLayout, digest: str) -> bytes:
    return (registry.layout_dir(REPO) / "blobs" / "sha256" / digest[7:]).read_bytes()


async def test_a_manifest_signed_by_a_trusted_key_verifies(registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    await sign_manifest(registry, REPO, digest, signer("signing"))
    verified = await verify_manifest(registry, REPO, digest, Verifier([OURS.public]))
    assert verified == Verified(digest, f"{REPO}@{digest}")


async def test_the_attachment_is_cosigns_layout_and_the_payload_simple_signing(
        registry: OciLayout) -> None:
    """What containers/image's ``putSignaturesToSigstoreAttachments`` writes: an OCI
    manifest tagged ``sha256-<hex>.sig``, one simplesigning layer whose blob is the payload
    and whose annotation is the base64 DER signature over it, a config listing it."""
    digest = await push_image(registry, REPO, "ck-1")
    stored = await sign_manifest(registry, REPO, digest, signer("signing"))
    assert signature_tag(digest) == "sha256-" + digest.removeprefix("sha256:") + ".sig"
    assert (await registry.get_manifest(REPO, signature_tag(digest))).digest == stored
    manifest = await attachment(registry, digest)
    assert manifest["mediaType"] == OCI_MANIFEST
    [layer] = manifest["layers"]
    assert layer["mediaType"] == PAYLOAD_TYPE
    body = payload(f"{REPO}@{digest}", digest)
    assert json.loads(body) == {
        "critical": {"identity": {"docker-reference": f"{REPO}@{digest}"},
                     "image": {"docker-manifest-digest": digest},
                     "type": "cosign container image signature"},
        "optional": None}
    assert blob(registry, layer["digest"]) == body
    OURS.public.verify(base64.b64decode(layer["annotations"][SIGNATURE_ANNOTATION]), body,
                       ec.ECDSA(hashes.SHA256()))
    assert manifest["config"]["mediaType"] == OCI_CONFIG
    assert json.loads(blob(registry, manifest["config"]["digest"]))["rootfs"] == {
        "type": "layers", "diff_ids": [layer["digest"]]}


async def test_an_unsigned_manifest_is_refused_as_unsigned(registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    with pytest.raises(Unsigned, match=signature_tag(digest)):
        await verify_manifest(registry, REPO, digest, Verifier([OURS.public]))


async def test_a_manifest_signed_by_another_key_is_refused_as_untrusted(
        registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    await sign_manifest(registry, REPO, digest, signer("attacker"))
    with pytest.raises(UntrustedSignature, match="no trusted key"):
        await verify_manifest(registry, REPO, digest, Verifier([OURS.public]))


async def test_a_trusted_signature_of_another_manifest_is_refused_as_a_mismatch(
        registry: OciLayout) -> None:
    """The real signature copied onto a forged push: trusted, but it names the real digest."""
    real = await push_image(registry, REPO, "ck-1")
    forged = await push_image(registry, REPO, "forged")
    await sign_manifest(registry, REPO, real, signer("signing"))
    ours = await registry.get_manifest(REPO, signature_tag(real))
    await registry.push_manifest(REPO, ours.body, media_type=ours.media_type,
                                 tag=signature_tag(forged))
    with pytest.raises(DigestMismatch, match=f"signature of {real}, not of {forged}"):
        await verify_manifest(registry, REPO, forged, Verifier([OURS.public]))


async def test_a_trusted_signature_for_another_repository_is_refused_as_a_mismatch(
        registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    ours = signer("signing")
    body = payload(f"localhost:5000/other/app@{digest}", digest)
    stored = await registry.push_blob(REPO, body, media_type=PAYLOAD_TYPE)
    config = await registry.push_blob(REPO, b"{}", media_type=OCI_CONFIG)
    layer = Descriptor(PAYLOAD_TYPE, stored.digest, stored.size, {
        SIGNATURE_ANNOTATION: base64.b64encode(ours.sign(body)).decode()})
    await registry.push_manifest(REPO, json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
         "config": Descriptor(OCI_CONFIG, config.digest, config.size).to_json(),
         "layers": [layer.to_json()]}).encode(), media_type=OCI_MANIFEST,
        tag=signature_tag(digest))
    with pytest.raises(DigestMismatch, match="not for repository"):
        await verify_manifest(registry, REPO, digest, Verifier([OURS.public]))


async def test_a_second_signature_is_added_and_the_first_kept(registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    await sign_manifest(registry, REPO, digest, signer("attacker"))
    first = (await attachment(registry, digest))["layers"]
    await sign_manifest(registry, REPO, digest, signer("signing"))
    layers = (await attachment(registry, digest))["layers"]
    assert len(layers) == 2
    assert layers[0] == first[0]
    await verify_manifest(registry, REPO, digest, Verifier([OURS.public]))
    await verify_manifest(registry, REPO, digest, Verifier([ATTACKER.public]))


async def test_signing_again_with_the_same_key_adds_nothing(registry: OciLayout) -> None:
    digest = await push_image(registry, REPO, "ck-1")
    once = await sign_manifest(registry, REPO, digest, signer("signing"))
    assert await sign_manifest(registry, REPO, digest, signer("signing")) == once


async def test_during_key_rotation_old_and_new_signatures_both_verify(
        registry: OciLayout) -> None:
    old = await push_image(registry, REPO, "ck-old")
    new = await push_image(registry, REPO, "ck-new")
    await sign_manifest(registry, REPO, old, signer("signing"))
    await sign_manifest(registry, REPO, new, signer("signing-new"))
    rotating = Verifier([OURS.public, NEW.public])
    for digest in (old, new):
        assert (await verify_manifest(registry, REPO, digest, rotating)).manifest_digest == digest
    with pytest.raises(UntrustedSignature):
        await verify_manifest(registry, REPO, old, Verifier([NEW.public]))


def test_keys_never_show_in_a_repr() -> None:
    ours = signer("signing")
    assert repr(ours) == f"Signer({OURS.kid})"
    assert repr(Verifier([OURS.public, NEW.public])) == f"Verifier({[OURS.kid, NEW.kid]!r})"


def test_only_p256_keys_sign_or_verify() -> None:
    with pytest.raises(ValueError, match="P-256"):
        Signer(ec.generate_private_key(ec.SECP384R1()))
    with pytest.raises(ValueError, match="at least one"):
        Verifier([])
