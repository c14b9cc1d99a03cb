"""Checkpoint manifests signed and verified as containers/image does sigstore signatures.

The format (containers/image ``signature/internal/sigstore_payload.go``,
``docker/docker_image_dest.go`` and ``docker_image_src.go``, cosign's attachments):

- the **payload** is "simple signing" JSON: ``{"critical": {"identity":
  {"docker-reference": REF}, "image": {"docker-manifest-digest": DIGEST}, "type":
  "cosign container image signature"}, "optional": null}`` (``optional`` must be present);
- the **signature** is ECDSA P-256 over the payload's SHA-256 (ASN.1 DER), base64 in the
  layer annotation ``dev.cosignproject.cosign/signature``;
- they are stored as an OCI manifest tagged ``sha256-<hex>.sig`` in the same repository:
  one layer per signature (media type ``application/vnd.dev.cosign.simplesigning.v1+json``,
  the blob is the payload) and a config listing the layers' digests as ``diff_ids``. A
  second signer adds a layer; every layer already there is kept.

We sign ``REPO@DIGEST`` as the docker-reference: skopeo's default identity rule
(``matchRepoDigestOrExact``) refuses a bare repository name, which cosign writes. A
``policy.json`` requiring ``sigstoreSigned`` with our public key (and
``use-sigstore-attachments: true`` in registries.d) checks ours; Debian's skopeo reads
them as its own but its sigstore check is patched out (``test_skopeo_signatures.py``
pins what it can show). :func:`verify_manifest` is the restore side's own check, done
before any layer is pulled: some signature by a trusted key, over a payload naming
exactly this manifest digest in this repository. Keys never reach a log or a ``repr``.
Used by :mod:`drivers.agent.sealing` and :mod:`drivers.registry.observer`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from drivers.registry.errors import RegistryBadResponse, RegistryNotFound
from drivers.registry.port import OCI_MANIFEST, Descriptor, Registry, sha256_digest
from drivers.sealing.keys import key_id, load_private_key, load_public_key

PAYLOAD_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SIGNATURE_TYPE = "cosign container image signature"
# containers/image reads at most 4 MiB of a signature (iolimits.MaxSignatureBodySize).
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
# Layer digests in a .sig manifest are untrusted: strict, so none becomes a path or a URL.
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class SignatureRefused(Exception):
    """The manifest is not signed as ours."""


class Unsigned(SignatureRefused):
    """No signature is stored for the manifest."""


class UntrustedSignature(SignatureRefused):
    """Signed, but by no trusted key (a re-signed image)."""


class DigestMismatch(SignatureRefused):
    """A trusted signature, but of another manifest or repository (a copied signature)."""


def signature_tag(manifest_digest: str) -> str:
    """``sha256-<hex>.sig``: where containers/image and cosign look for the signatures."""
    if not _DIGEST.fullmatch(manifest_digest):
        raise ValueError(f"{manifest_digest!r} is not a sha256 manifest digest")
    return manifest_digest.replace(":", "-", 1) + ".sig"


def payload(docker_reference: str, manifest_digest: str) -> bytes:
    """The simple signing payload, canonical bytes (sorted keys, no spaces)."""
    body = {"critical": {"identity": {"docker-reference": docker_reference},
                         "image": {"docker-manifest-digest": manifest_digest},
                         "type": SIGNATURE_TYPE},
            "optional": None}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _p256(key: object, what: str) -> None:
    if not (isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey)
            and isinstance(key.curve, ec.SECP256R1)):
        raise ValueError(f"the {what} must be an EC P-256 key (as cosign's), not "
                         f"{type(key).__name__}")


class Signer:
    """An ECDSA P-256 private key that signs payloads."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        _p256(key, "signing key")
        self._key = key
        self.key_id = key_id(key)

    @classmethod
    def from_pem(cls, pem: bytes) -> Signer:
        return cls(load_private_key(pem))

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key.public_key()

    def sign(self, data: bytes) -> bytes:
        """A DER ECDSA signature over SHA-256(data)."""
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def __repr__(self) -> str:  # never the key
        return f"Signer({self.key_id})"


class Verifier:
    """Trusted public keys: the old and the new one while a signing key rotates."""

    def __init__(self, keys: Sequence[ec.EllipticCurvePublicKey]) -> None:
        if not keys:
            raise ValueError("a verifier needs at least one trusted public key")
        for key in keys:
            _p256(key, "trusted key")
        self._keys = list(keys)

    @classmethod
    def from_pems(cls, pems: Sequence[bytes]) -> Verifier:
        return cls([load_public_key(pem) for pem in pems])

    def verify(self, data: bytes, signature: bytes) -> bool:
        """Whether any trusted key made ``signature`` (DER ECDSA over SHA-256(data))."""
        for key in self._keys:
            try:
                key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            except InvalidSignature:
                continue
            return True
        return False

    def __repr__(self) -> str:
        return f"Verifier({[key_id(key) for key in self._keys]})"


@dataclass(frozen=True)
class Verified:
    manifest_digest: str
    docker_reference: str


async def _read_blob(registry: Registry, repository: str, digest: str) -> bytes:
    fd, name = tempfile.mkstemp(prefix="sig-")
    os.close(fd)
    path = Path(name)
    try:
        await registry.get_blob(repository, digest, path)
        return await asyncio.to_thread(path.read_bytes)
    finally:
        await asyncio.to_thread(path.unlink, True)


async def _attachment(registry: Registry, repository: str,
                      manifest_digest: str) -> list[dict[str, Any]]:
    """The layers of the signature manifest of ``manifest_digest`` (``[]``: none)."""
    try:
        stored = await registry.get_manifest(repository, signature_tag(manifest_digest))
    except RegistryNotFound:
        return []
    try:
        layers = json.loads(stored.body).get("layers") or []
    except (ValueError, AttributeError) as exc:
        raise RegistryBadResponse(f"the signature manifest of {manifest_digest} is not "
                                  "JSON") from exc
    return [layer for layer in layers if isinstance(layer, dict)] if isinstance(
        layers, list) else []


def _annotation(layer: dict[str, Any]) -> bytes | None:
    """The layer's DER signature, ``None`` if it carries no readable one."""
    annotations = layer.get("annotations")
    raw = annotations.get(SIGNATURE_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        return None


def _serialize(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


async def sign_manifest(registry: Registry, repository: str, manifest_digest: str,
                        signer: Signer) -> str:
    """Store a signature of ``repository@manifest_digest``; returns the signature
    manifest's digest. Every layer already there is kept (as containers/image's
    ``putSignaturesToSigstoreAttachments``); signing again with the same key adds nothing."""
    tag = signature_tag(manifest_digest)
    body = payload(f"{repository}@{manifest_digest}", manifest_digest)
    body_digest = sha256_digest(body)
    layers = await _attachment(registry, repository, manifest_digest)
    for layer in layers:
        existing = _annotation(layer)
        if (layer.get("digest") == body_digest and existing is not None
                and Verifier([signer.public_key()]).verify(body, existing)):
            return (await registry.get_manifest(repository, tag)).digest
    signature = base64.b64encode(signer.sign(body)).decode()
    pushed = await registry.push_blob(repository, body, media_type=PAYLOAD_TYPE)
    layers.append(Descriptor(PAYLOAD_TYPE, pushed.digest, pushed.size,
                             {SIGNATURE_ANNOTATION: signature}).to_json())
    # The config's diff_ids list every layer, as containers/image and cosign write it;
    # nothing reads it, so it is rebuilt rather than fetched. Two signers racing on one
    # digest can drop one signature (a read-modify-write of the tag, as in containers/image).
    config = _serialize({"architecture": "", "os": "", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": [str(layer.get("digest")) for layer in layers]}})
    config_desc = await registry.push_blob(repository, config, media_type=CONFIG_TYPE)
    manifest = _serialize({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": Descriptor(CONFIG_TYPE, config_desc.digest,
                                                config_desc.size).to_json(),
                           "layers": layers})
    return await registry.push_manifest(repository, manifest, media_type=OCI_MANIFEST,
                                        tag=tag)


def _repository_of(reference: str) -> str:
    """``host/repo`` of ``host/repo``, ``host/repo:tag`` or ``host/repo@sha256:...``."""
    name = reference.split("@", 1)[0]
    head, _, tail = name.rpartition("/")
    tail = tail.split(":", 1)[0]
    return f"{head}/{tail}" if head else tail


async def verify_manifest(registry: Registry, repository: str, manifest_digest: str,
                          verifier: Verifier) -> Verified:
    """Accept ``repository@manifest_digest`` only if a trusted key signed a payload naming
    exactly it; otherwise the :class:`SignatureRefused` that says what did not verify."""
    tag = signature_tag(manifest_digest)
    layers = await _attachment(registry, repository, manifest_digest)
    signed = [layer for layer in layers if layer.get("mediaType") == PAYLOAD_TYPE]
    if not signed:
        raise Unsigned(f"{repository}@{manifest_digest} has no signature ({tag} is absent "
                       "or holds none): not pushed by our agents, or pushed before signing "
                       "was configured; check the capturing node's --signing-key")
    mismatch = ""
    for layer in signed:
        signature, digest, size = _annotation(layer), layer.get("digest"), layer.get("size")
        if (signature is None or not isinstance(digest, str) or not _DIGEST.fullmatch(digest)
                or not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD_BYTES):
            continue
        body = await _read_blob(registry, repository, digest)
        if sha256_digest(body) != digest or not verifier.verify(body, signature):
            continue
        try:
            critical = json.loads(body)["critical"]
            kind = critical["type"]
            named = critical["image"]["docker-manifest-digest"]
            reference = critical["identity"]["docker-reference"]
        except (ValueError, KeyError, TypeError):
            mismatch = "a trusted signature over a payload that is not simple signing"
            continue
        if kind != SIGNATURE_TYPE or not isinstance(reference, str):
            mismatch = f"a trusted signature of type {kind!r}, not {SIGNATURE_TYPE!r}"
        elif named != manifest_digest:
            mismatch = f"a trusted signature of {named}, not of {manifest_digest}"
        elif _repository_of(reference) != repository:
            mismatch = f"a trusted signature for {reference}, not for repository {repository}"
        else:
            return Verified(manifest_digest, reference)
    if mismatch:
        raise DigestMismatch(f"{repository}@{manifest_digest} carries {mismatch}: a "
                             "signature copied onto another image; check who pushed "
                             f"{tag} and the manifest it names")
    raise UntrustedSignature(f"{repository}@{manifest_digest} is signed, but by no trusted "
                             "key: re-signed by someone else, or the agents' signing key "
                             "is not among the restoring node's --trusted-key")
