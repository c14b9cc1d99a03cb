"""Checkpoint manifests signed and verified as containers/image does sigstore signatures.

The format (containers/image ``signature/internal/sigstore_payload.go``,
``docker/docker_image_dest.go`` and ``docker_image_src.go``, cosign's attachments):

- the **payload** is "simple signing" JSON: ``{"critical": {"identity":
  {"docker-reference": REPO}, "image": {"docker-manifest-digest": DIGEST}, "type":
  "cosign container image signature"}, "optional": null}``;
- the **signature** is ECDSA P-256 over the payload's SHA-256 (ASN.1 DER), base64 in the
  layer annotation ``dev.cosignproject.cosign/signature``;
- they are stored as an OCI manifest tagged ``sha256-<hex>.sig`` in the same repository:
  one layer per signature (media type ``application/vnd.dev.cosign.simplesigning.v1+json``,
  the blob is the payload) and a config listing the payloads' digests. A second signer
  adds a layer; the first is kept.

So skopeo or podman with a ``policy.json`` requiring ``sigstoreSigned`` and our public key
(and ``use-sigstore-attachments: true`` in registries.d) accept ours and refuse others.
:func:`verify_manifest` is the restore side's own check, done before any layer is
pulled: some signature by a trusted key, over a payload naming exactly this manifest
digest in this repository. Keys never reach a log. Used by :mod:`drivers.agent.sealing`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
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


class SignatureRefused(Exception):
    """The manifest is not signed as ours."""


class Unsigned(SignatureRefused):
    """No signature is stored for the manifest."""


class UntrustedSignature(SignatureRefused):
    """Signed, but by no trusted key (a re-signed image)."""


class DigestMismatch(SignatureRefused):
    """A trusted signature, but of another manifest or repository (a copied signature)."""


def signature_tag(manifest_digest: str) -> str:
    algorithm, _, hex_part = manifest_digest.partition(":")
    return f"{algorithm}-{hex_part}.sig"


def payload(docker_reference: str, manifest_digest: str) -> bytes:
    body = {"critical": {"identity": {"docker-reference": docker_reference},
                         "image": {"docker-manifest-digest": manifest_digest},
                         "type": SIGNATURE_TYPE},
            "optional": None}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Signer:
    """An ECDSA P-256 private key that signs payloads."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        self._key = key
        self.key_id = key_id(key)

    @classmethod
    def from_pem(cls, pem: bytes) -> Signer:
        key = load_private_key(pem)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the signing key must be an EC P-256 key (as cosign's)")
        return cls(key)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def __repr__(self) -> str:  # never the key
        return f"Signer({self.key_id})"


class Verifier:
    """Trusted public keys: the old and the new one while a signing key rotates."""

    def __init__(self, keys: Sequence[ec.EllipticCurvePublicKey]) -> None:
        self._keys = list(keys)

    @classmethod
    def from_pems(cls, pems: Sequence[bytes]) -> Verifier:
        keys = [load_public_key(pem) for pem in pems]
        if not all(isinstance(k, ec.EllipticCurvePublicKey) for k in keys):
            raise ValueError("trusted keys must be EC P-256 public keys")
        return cls(keys)

    def verify(self, data: bytes, signature: bytes) -> bool:
        for key in self._keys:
            try:
                key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            except InvalidSignature:
                continue
            return True
        return False


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
    """The signature layers stored for ``manifest_digest`` (``[]``: none)."""
    try:
        stored = await registry.get_manifest(repository, signature_tag(manifest_digest))
    except RegistryNotFound:
        return []
    try:
        layers = json.loads(stored.body).get("layers") or []
    except (ValueError, AttributeError) as exc:
        raise RegistryBadResponse(f"the signature manifest of {manifest_digest} is not "
                                  "JSON") from exc
    return [layer for layer in layers if isinstance(layer, dict)]


async def sign_manifest(registry: Registry, repository: str, manifest_digest: str,
                        signer: Signer) -> str:
    """Store a signature of ``repository@manifest_digest``; returns the signature
    manifest's digest. Signatures already there are kept."""
    body = payload(repository, manifest_digest)
    signature = base64.b64encode(signer.sign(body)).decode()
    layers = [layer for layer in await _attachment(registry, repository, manifest_digest)
              if layer.get("mediaType") == PAYLOAD_TYPE]
    pushed = await registry.push_blob(repository, body, media_type=PAYLOAD_TYPE)
    layers.append(Descriptor(PAYLOAD_TYPE, pushed.digest, pushed.size,
                             {SIGNATURE_ANNOTATION: signature}).to_json())
    config = json.dumps({"architecture": "", "os": "", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": [layer["digest"] for layer in layers]}},
                        sort_keys=True, separators=(",", ":")).encode()
    config_desc = await registry.push_blob(repository, config, media_type=CONFIG_TYPE)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": Descriptor(CONFIG_TYPE, config_desc.digest,
                                                config_desc.size).to_json(),
                           "layers": layers}, sort_keys=True, separators=(",", ":")).encode()
    return await registry.push_manifest(repository, manifest, media_type=OCI_MANIFEST,
                                        tag=signature_tag(manifest_digest))


def _repository_of(reference: str) -> str:
    """``host/repo`` of ``host/repo:tag`` or ``host/repo@sha256:...``."""
    name = reference.split("@", 1)[0]
    head, _, tail = name.rpartition("/")
    if ":" in tail:
        tail = tail.split(":", 1)[0]
    return f"{head}/{tail}" if head else tail


async def verify_manifest(registry: Registry, repository: str, manifest_digest: str,
                          verifier: Verifier) -> Verified:
    """Accept ``repository@manifest_digest`` only if a trusted key signed a payload naming
    exactly it; otherwise the :class:`SignatureRefused` that says what did not verify."""
    layers = await _attachment(registry, repository, manifest_digest)
    signed = [layer for layer in layers if layer.get("mediaType") == PAYLOAD_TYPE]
    if not signed:
        raise Unsigned(f"{repository}@{manifest_digest} has no signature "
                       f"({signature_tag(manifest_digest)} is absent): not pushed by our "
                       "agents, or pushed before signing was configured")
    mismatch = ""
    for layer in signed:
        raw = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")
        try:
            signature = base64.b64decode(raw, validate=True)
        except ValueError:
            continue
        body = await _read_blob(registry, repository, str(layer.get("digest")))
        if sha256_digest(body) != layer.get("digest") or not verifier.verify(body, signature):
            continue
        try:
            critical = json.loads(body)["critical"]
            named = critical["image"]["docker-manifest-digest"]
            reference = critical["identity"]["docker-reference"]
        except (ValueError, KeyError, TypeError):
            mismatch = "a trusted signature over a payload that is not simple signing"
            continue
        if named != manifest_digest:
            mismatch = f"a trusted signature of {named}, not of {manifest_digest}"
            continue
        if _repository_of(str(reference)) != repository:
            mismatch = f"a trusted signature for repository {reference}, not {repository}"
            continue
        return Verified(manifest_digest, str(reference))
    if mismatch:
        raise DigestMismatch(f"{repository}@{manifest_digest} carries {mismatch}: a "
                             "signature copied onto another image")
    raise UntrustedSignature(f"{repository}@{manifest_digest} is signed, but by no trusted "
                             "key: re-signed by someone else, or the agents' signing key "
                             "is not among the restoring node's --trusted-key")
