"""One layer sealed and unsealed in ocicrypt's format, so skopeo, podman and CRI-O open our
layers and we open theirs (containers/ocicrypt, read at HEAD; checked against skopeo 1.9.3).

- The cipher is ``AES_256_CTR_HMAC_SHA256``, ocicrypt's only one: a fresh 32-byte key and
  16-byte nonce per layer, AES-256-CTR over the layer, HMAC-SHA256 keyed with the same key
  over the *ciphertext*, checked once the whole stream is read. Streamed in 1 MiB chunks:
  memory stays bounded at any layer size.
- The media type gets ``+encrypted``.
- ``org.opencontainers.image.enc.pubopts``: standard base64 of the JSON public options
  ``{"cipher", "hmac", "cipheroptions": {}}`` (Go encodes ``[]byte`` as standard base64).
- ``org.opencontainers.image.enc.keys.jwe``: standard base64 of a JWE in JSON
  serialisation (content encryption A256GCM) of the private options ``{"symkey",
  "digest", "cipheroptions": {"nonce"}}``, one recipient per public key: RSA-OAEP for RSA,
  ECDH-ES+A256KW for EC, as ocicrypt's ``keywrap/jwe`` chooses. Ours carry their key id as
  the recipient's ``kid`` (:func:`sealed_for` reads them back without a key; skopeo's name
  none). ocicrypt joins several JWEs with commas when recipients are added later.

The JWE is jwcrypto's (on ``cryptography``): no hand-written JOSE. Synchronous (callers run
it in a thread); nothing here logs, and no message holds key material. Used by the node
agent (:mod:`drivers.agent.sealing`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from jwcrypto import jwe, jwk
from jwcrypto.common import JWException

from drivers.sealing.errors import BadSealedLayer, NotForUs, Tampered
from drivers.sealing.keys import PrivateKey, PublicKey, key_id, public_half

ENCRYPTED_SUFFIX = "+encrypted"
KEYS_JWE = "org.opencontainers.image.enc.keys.jwe"
PUBOPTS = "org.opencontainers.image.enc.pubopts"
CIPHER = "AES_256_CTR_HMAC_SHA256"
CHUNK = 1 << 20
KEY_BYTES, NONCE_BYTES = 32, 16
# What ocicrypt's keywrap/jwe unwraps (key algorithms) and RFC 7518's content encryptions;
# jwcrypto's defaults would also take "dir" and PBES2, which no ocicrypt layer uses.
JWE_ALGS = ("RSA-OAEP", "RSA-OAEP-256", "ECDH-ES+A128KW", "ECDH-ES+A192KW", "ECDH-ES+A256KW",
            "A128CBC-HS256", "A192CBC-HS384", "A256CBC-HS512", "A128GCM", "A192GCM",
            "A256GCM")


@dataclass(frozen=True)
class SealedLayer:
    """What :func:`encrypt_layer` made: the sealed blob, the plain one, the annotations."""

    digest: str  # of the sealed file (what the registry stores and the manifest lists)
    size: int
    plain_digest: str  # of the plain layer (an image config's diff_id)
    plain_size: int
    annotations: dict[str, str]  # KEYS_JWE and PUBOPTS, for the layer's descriptor


def is_encrypted(media_type: str) -> bool:
    return media_type.endswith(ENCRYPTED_SUFFIX)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object, *, what: str) -> bytes:
    if not isinstance(text, str):
        raise BadSealedLayer(f"{what} is not a base64 string")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadSealedLayer(f"{what} is not standard base64") from exc


def _go_json(value: object) -> bytes:
    """JSON as Go's encoding/json writes it (no spaces; the keys in our fields' order)."""
    return json.dumps(value, separators=(",", ":")).encode()


def _cipher(key: bytes, nonce: bytes) -> Cipher[modes.CTR]:
    return Cipher(algorithms.AES(key), modes.CTR(nonce))


def _recipient(key: PublicKey) -> tuple[Any, str]:
    public = public_half(key)
    if isinstance(public, ec.EllipticCurvePublicKey):
        return public, "ECDH-ES+A256KW"
    if isinstance(public, rsa.RSAPublicKey):
        return public, "RSA-OAEP"
    raise ValueError(f"a recipient is a {type(key).__name__}; seal for EC or RSA public keys")


class _Hashing:
    """Hash objects fed in a thread of their own: SHA-256 is the cost of sealing (about
    370 MB/s a core here, AES-CTR ten times that), and hashlib releases the GIL on large
    updates, so the digests of the plain and sealed bytes run beside the cipher and the
    HMAC. At most ``depth`` chunks wait, so memory stays bounded."""

    def __init__(self, *hashes: Any, depth: int = 8) -> None:
        self._hashes = hashes
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="seal-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            for h in self._hashes:
                h.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._chunks.put(chunk)

    def close(self) -> None:
        """Wait until every chunk is hashed (also on failure: the thread always ends)."""
        self._chunks.put(None)
        self._thread.join()


def encrypt_layer(plain: Path, sealed: Path, recipients: Sequence[PublicKey]) -> SealedLayer:
    """Encrypt ``plain`` into ``sealed`` (mode 0600) for ``recipients`` (at least one:
    ``ValueError`` otherwise); a failure removes the partial ``sealed`` file."""
    if not recipients:
        raise ValueError("a sealed layer needs at least one recipient public key")
    wrapped = [_recipient(key) for key in recipients]
    key, nonce = os.urandom(KEY_BYTES), os.urandom(NONCE_BYTES)
    encryptor = _cipher(key, nonce).encryptor()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    plain_hash, sealed_hash = hashlib.sha256(), hashlib.sha256()
    size = 0
    plain_side, sealed_side = _Hashing(plain_hash), _Hashing(sealed_hash)
    try:
        fd = os.open(sealed, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with plain.open("rb") as source, os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                plain_side.update(chunk)
                data = encryptor.update(chunk)
                sealed_side.update(data)
                mac.update(data)
                out.write(data)
            encryptor.finalize()  # CTR keeps no tail
    except BaseException:
        sealed.unlink(missing_ok=True)
        raise
    finally:
        plain_side.close()
        sealed_side.close()
    plain_digest = "sha256:" + plain_hash.hexdigest()
    private = {"symkey": _b64(key), "digest": plain_digest,
               "cipheroptions": {"nonce": _b64(nonce)}}
    public = {"cipher": CIPHER, "hmac": _b64(mac.digest()), "cipheroptions": {}}
    token = jwe.JWE(_go_json(private), protected=_go_json({"enc": "A256GCM"}).decode())
    for recipient, alg in wrapped:
        token.add_recipient(jwk.JWK.from_pyca(recipient),
                            header=_go_json({"alg": alg, "kid": key_id(recipient)}).decode())
    annotations = {KEYS_JWE: _b64(token.serialize().encode()), PUBOPTS: _b64(_go_json(public))}
    return SealedLayer("sha256:" + sealed_hash.hexdigest(), size, plain_digest, size,
                       annotations)


def _jwes(annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    raw = annotations.get(KEYS_JWE, "")
    if not raw:
        raise BadSealedLayer(f"the layer has no {KEYS_JWE} annotation: no key is wrapped for "
                             "anyone (not an ocicrypt JWE layer, or its annotations were lost)")
    found = []
    for number, part in enumerate(raw.split(",")):  # encryption.go joins JWEs with commas
        what = f"{KEYS_JWE} (JWE {number})"
        try:
            token = json.loads(_unb64(part, what=what))
        except ValueError as exc:
            raise BadSealedLayer(f"{what} is not a JWE in JSON serialisation") from exc
        if not isinstance(token, dict):
            raise BadSealedLayer(f"{what} is not a JWE in JSON serialisation")
        found.append(token)
    return found


def sealed_for(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The key ids (recipients' ``kid``) the layer is sealed for, read without any key;
    empty when its JWE names none (skopeo's). ``BadSealedLayer`` if malformed."""
    kids: dict[str, None] = {}
    for token in _jwes(annotations):
        recipients = token.get("recipients")
        for recipient in recipients if isinstance(recipients, list) else [token]:
            header = recipient.get("header") if isinstance(recipient, dict) else None
            kid = header.get("kid") if isinstance(header, dict) else None
            if isinstance(kid, str):
                kids[kid] = None
    return tuple(kids)


def _public_options(annotations: Mapping[str, str]) -> tuple[bytes, dict[str, Any]]:
    """The expected HMAC and the public cipher options."""
    if not annotations.get(PUBOPTS):
        raise BadSealedLayer(f"the layer has no {PUBOPTS} annotation (ocicrypt's cipher and "
                             "HMAC): it cannot be checked, so it is not unsealed")
    try:
        public = json.loads(_unb64(annotations[PUBOPTS], what=PUBOPTS))
    except ValueError as exc:
        raise BadSealedLayer(f"{PUBOPTS} is not base64 of JSON") from exc
    if not isinstance(public, dict):
        raise BadSealedLayer(f"{PUBOPTS} is not a JSON object")
    if public.get("cipher") != CIPHER:
        raise BadSealedLayer(f"{PUBOPTS} names cipher {public.get('cipher')!r}; ocicrypt "
                             f"layers use {CIPHER}")
    mac = _unb64(public.get("hmac"), what=f"{PUBOPTS} hmac")
    if not mac:
        raise BadSealedLayer(f"{PUBOPTS} carries no hmac, so the layer cannot be checked")
    options = public.get("cipheroptions") or {}
    if not isinstance(options, dict):
        raise BadSealedLayer(f"{PUBOPTS} cipheroptions is not a JSON object")
    return mac, options


def _private_options(annotations: Mapping[str, str],
                     keys: Sequence[PrivateKey]) -> dict[str, Any]:
    """The first JWE any key opens, decoded; ``NotForUs`` (or ``Tampered``) if none does."""
    tokens = _jwes(annotations)
    ours = [(key_id(key), jwk.JWK.from_pyca(key)) for key in keys]
    for token in tokens:
        text = json.dumps(token)
        for _, key in ours:
            opened = jwe.JWE(algs=list(JWE_ALGS))
            try:
                opened.deserialize(text, key=key)
            except (JWException, ValueError, TypeError):
                continue
            try:
                options = json.loads(opened.payload)
            except ValueError as exc:
                raise BadSealedLayer(f"{KEYS_JWE} opens, but holds no JSON options") from exc
            if not isinstance(options, dict):
                raise BadSealedLayer(f"{KEYS_JWE} opens, but holds no JSON options")
            return options
    kids = sealed_for(annotations)
    held = [kid for kid, _ in ours if kid in kids]
    if held:
        raise Tampered(f"{KEYS_JWE} is sealed for {held[0]}, a key given here, yet it does not "
                       "open with it: the annotation was changed or corrupted")
    raise NotForUs(f"the layer is sealed for {', '.join(kids) or 'recipients it does not name'}"
                   f"; the keys given are {', '.join(k for k, _ in ours) or 'none'}: give a key "
                   "it was sealed for (keep a rotated-out key while its checkpoints are kept)",
                   sealed_for=kids)


def _nonce(private: Mapping[str, Any], public: Mapping[str, Any]) -> bytes:
    sealed = private.get("cipheroptions") or {}
    if not isinstance(sealed, dict):
        raise BadSealedLayer(f"the options in {KEYS_JWE} have a cipheroptions that is not a "
                             "JSON object")
    # ocicrypt's GetOpt reads the public options first (blockcipher.go), but only its
    # private ones are authenticated: a differing public nonce is an edit, not a choice.
    if "nonce" in sealed and "nonce" in public and sealed["nonce"] != public["nonce"]:
        raise Tampered(f"{PUBOPTS} carries a nonce other than the sealed one")
    found = sealed.get("nonce", public.get("nonce"))
    nonce = _unb64(found, what="the nonce")
    if len(nonce) != NONCE_BYTES:
        raise BadSealedLayer(f"the nonce is {len(nonce)} bytes; AES-256-CTR takes "
                             f"{NONCE_BYTES}")
    return nonce


def decrypt_layer(sealed: Path, plain: Path, annotations: Mapping[str, str],
                  keys: Sequence[PrivateKey], *, expected_digest: str | None = None) -> str:
    """Decrypt ``sealed`` into ``plain`` (mode 0600) with the first of ``keys`` that opens
    it; returns the plain digest.

    The HMAC is checked, and the plain digest against ``expected_digest`` when the caller
    has a trusted one (an image config's diff_id). ``plain`` only appears once both hold:
    the bytes go to a ``.partial`` file beside it, removed on any failure, so no unchecked
    plain text is left behind. Raises ``NotForUs``, ``Tampered`` or ``BadSealedLayer``.
    """
    expected_mac, public = _public_options(annotations)
    private = _private_options(annotations, keys)
    key = _unb64(private.get("symkey"), what="the layer key (symkey)")
    if len(key) != KEY_BYTES:
        raise BadSealedLayer(f"the layer key is {len(key)} bytes; AES-256-CTR takes "
                             f"{KEY_BYTES}")
    decryptor = _cipher(key, _nonce(private, public)).decryptor()
    mac = hmac.new(key, digestmod=hashlib.sha256)
    plain_hash = hashlib.sha256()
    partial = plain.with_name(plain.name + ".partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        plain_side = _Hashing(plain_hash)
        try:
            with sealed.open("rb") as source, os.fdopen(fd, "wb") as out:
                while chunk := source.read(CHUNK):
                    data = decryptor.update(chunk)
                    plain_side.update(data)
                    mac.update(chunk)
                    out.write(data)
                decryptor.finalize()
        finally:
            plain_side.close()
        if not hmac.compare_digest(mac.digest(), expected_mac):
            raise Tampered(f"the sealed blob's HMAC does not match the one in {PUBOPTS}: the "
                           "blob or its annotations were changed")
        digest = "sha256:" + plain_hash.hexdigest()
        # Not checked: the options' own "digest". ocicrypt never reads it back
        # (commonDecryptLayer returns a digest Decrypt never sets), and containers/image
        # writes the digest of the blob it was given, before it compresses: skopeo's
        # layers pushed to a registry are gzip inside, and that digest is the tar's. Only
        # the caller knows a digest it trusts (a signed config's diff_id): expected_digest.
        if expected_digest is not None and digest != expected_digest:
            raise Tampered(f"the unsealed layer is {digest}, not the expected "
                           f"{expected_digest}: the layer was replaced or re-sealed")
        os.replace(partial, plain)
        return digest
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
