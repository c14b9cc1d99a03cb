"""One layer sealed and unsealed in ocicrypt's format (containers/ocicrypt, read at HEAD).

The format, as ``blockcipher/blockcipher_aes_ctr.go`` and ``encryption.go`` write it, so
that skopeo, podman and CRI-O open our layers and we open theirs:

- the layer is encrypted with ``AES_256_CTR_HMAC_SHA256`` (ocicrypt's only cipher): a
  fresh 32-byte key and 16-byte nonce per layer, AES-256-CTR over the plain bytes,
  HMAC-SHA256 (keyed with the same key) over the ciphertext, checked at the end of a
  decryption — streamed in 1 MiB chunks, so memory stays bounded at any layer size;
- the media type gets ``+encrypted``;
- ``org.opencontainers.image.enc.pubopts``: base64 of the JSON public options
  ``{"cipher", "hmac", "cipheroptions"}`` (Go's ``[]byte`` is standard base64);
- ``org.opencontainers.image.enc.keys.jwe``: base64 of a JWE (JSON serialisation, content
  encryption A256GCM) of the private options ``{"symkey", "digest", "cipheroptions":
  {"nonce"}}`` with one recipient per public key (RSA-OAEP for RSA, ECDH-ES+A256KW for
  EC, as ``keywrap/jwe`` chooses), each carrying its key id as ``kid``. ``digest`` is
  the plain layer's digest, checked after decryption.

The JWE is jwcrypto's (on ``cryptography``): no hand-written JOSE. Nothing here logs.
Synchronous (the agent runs it in a thread). Used by :mod:`drivers.agent.sealing`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from jwcrypto import jwe, jwk
from jwcrypto.common import JWException

from drivers.sealing.errors import BadSealedLayer, NotForUs, Tampered
from drivers.sealing.keys import PrivateKey, PublicKey, key_id

ENCRYPTED_SUFFIX = "+encrypted"
KEYS_JWE = "org.opencontainers.image.enc.keys.jwe"
PUBOPTS = "org.opencontainers.image.enc.pubopts"
CIPHER = "AES_256_CTR_HMAC_SHA256"
CHUNK = 1 << 20


@dataclass(frozen=True)
class SealedLayer:
    digest: str  # of the sealed file (what the registry stores)
    size: int
    plain_digest: str  # of the plain layer (the image config's diff_id)
    plain_size: int
    annotations: dict[str, str]


def is_encrypted(media_type: str) -> bool:
    return media_type.endswith(ENCRYPTED_SUFFIX)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object, *, what: str) -> bytes:
    if not isinstance(text, str):
        raise BadSealedLayer(f"{what} is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise BadSealedLayer(f"{what} is not valid base64") from exc


def _crypt(key: bytes, nonce: bytes) -> Any:
    return Cipher(algorithms.AES(key), modes.CTR(nonce))


def encrypt_layer(plain: Path, sealed: Path, recipients: Sequence[PublicKey]) -> SealedLayer:
    """Encrypt ``plain`` into ``sealed`` for ``recipients`` (at least one)."""
    if not recipients:
        raise ValueError("a sealed layer needs at least one recipient")
    key, nonce = os.urandom(32), os.urandom(16)
    encryptor = _crypt(key, nonce).encryptor()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    plain_hash, sealed_hash = hashlib.sha256(), hashlib.sha256()
    plain_size = 0
    fd = os.open(sealed, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with plain.open("rb") as source, os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            plain_size += len(chunk)
            plain_hash.update(chunk)
            data = encryptor.update(chunk)
            mac.update(data)
            sealed_hash.update(data)
            out.write(data)
        tail = encryptor.finalize()  # CTR: empty
        mac.update(tail)
        sealed_hash.update(tail)
        out.write(tail)
    plain_digest = "sha256:" + plain_hash.hexdigest()
    private = {"symkey": _b64(key), "digest": plain_digest,
               "cipheroptions": {"nonce": _b64(nonce)}}
    public = {"cipher": CIPHER, "hmac": _b64(mac.digest()), "cipheroptions": {}}
    token = jwe.JWE(json.dumps(private).encode(), protected=json.dumps({"enc": "A256GCM"}))
    for recipient in recipients:
        alg = "ECDH-ES+A256KW" if isinstance(recipient, ec.EllipticCurvePublicKey) \
            else "RSA-OAEP"
        token.add_recipient(jwk.JWK.from_pyca(recipient),
                            header=json.dumps({"alg": alg, "kid": key_id(recipient)}))
    annotations = {KEYS_JWE: _b64(token.serialize().encode()),
                   PUBOPTS: _b64(json.dumps(public).encode())}
    return SealedLayer("sha256:" + sealed_hash.hexdigest(), sealed.stat().st_size,
                       plain_digest, plain_size, annotations)


def _jwes(annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    raw = annotations.get(KEYS_JWE, "")
    if not raw:
        raise BadSealedLayer(f"the layer has no {KEYS_JWE} annotation: not sealed for "
                             "anyone (or not an ocicrypt layer)")
    found = []
    for part in raw.split(","):  # ocicrypt joins several wrappers' values with commas
        try:
            found.append(json.loads(_unb64(part, what=KEYS_JWE)))
        except ValueError as exc:
            raise BadSealedLayer(f"{KEYS_JWE} is not a JWE in JSON serialisation") from exc
    return found


def sealed_for(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The key ids (``kid``) of the layer's recipients, read without any key."""
    kids = []
    for token in _jwes(annotations):
        for recipient in token.get("recipients") or [token]:
            kid = (recipient.get("header") or {}).get("kid")
            if isinstance(kid, str):
                kids.append(kid)
    return tuple(kids)


def _private_options(annotations: Mapping[str, str],
                     keys: Sequence[PrivateKey]) -> dict[str, Any]:
    for token in _jwes(annotations):
        text = json.dumps(token)
        for key in keys:
            try:
                opened = jwe.JWE()
                opened.deserialize(text, key=jwk.JWK.from_pyca(key))
            except (JWException, ValueError, TypeError):
                continue
            try:
                options: dict[str, Any] = json.loads(opened.payload)
            except ValueError as exc:
                raise BadSealedLayer("the unwrapped options are not JSON") from exc
            return options
    kids = ", ".join(sealed_for(annotations)) or "recipients that name no key id"
    ours = ", ".join(key_id(k) for k in keys) or "none"
    raise NotForUs(f"sealed for {kids}; the keys here are {ours}: give the node a key the "
                   "checkpoint was sealed for (a rotated-out key must be kept while its "
                   "checkpoints are)")


def decrypt_layer(sealed: Path, plain: Path, annotations: Mapping[str, str],
                  keys: Sequence[PrivateKey]) -> str:
    """Decrypt ``sealed`` into ``plain``, checking the HMAC and the plain digest; returns
    the plain digest. On any failure ``plain`` is removed: no partial plain text stays."""
    options = _private_options(annotations, keys)
    try:
        public = json.loads(_unb64(annotations.get(PUBOPTS, ""), what=PUBOPTS))
    except ValueError as exc:
        raise BadSealedLayer(f"{PUBOPTS} is not JSON") from exc
    if not isinstance(public, dict) or public.get("cipher") != CIPHER:
        raise BadSealedLayer(f"{PUBOPTS} names cipher {public.get('cipher') if isinstance(public, dict) else None!r}; "  # noqa: E501
                             f"ocicrypt layers use {CIPHER}")
    key = _unb64(options.get("symkey"), what="symkey")
    nonce = _unb64((options.get("cipheroptions") or {}).get("nonce"), what="nonce")
    expected_mac = _unb64(public.get("hmac"), what="hmac")
    if len(key) != 32 or len(nonce) != 16:
        raise BadSealedLayer("the layer key or nonce has the wrong length for AES-256-CTR")
    decryptor = _crypt(key, nonce).decryptor()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    plain_hash = hashlib.sha256()
    try:
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with sealed.open("rb") as source, os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                mac.update(chunk)
                data = decryptor.update(chunk)
                plain_hash.update(data)
                out.write(data)
            out.write(decryptor.finalize())
        if not hmac.compare_digest(mac.digest(), expected_mac):
            raise Tampered("the ciphertext's HMAC does not match the layer's pubopts: the "
                           "blob or its annotations were changed")
        digest = "sha256:" + plain_hash.hexdigest()
        if options.get("digest") and options["digest"] != digest:
            raise Tampered(f"the unsealed layer is {digest}, but its sealed options say "
                           f"{options['digest']}")
        return digest
    except BaseException:
        plain.unlink(missing_ok=True)
        raise
