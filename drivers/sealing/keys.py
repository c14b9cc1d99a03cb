"""Keys of sealed checkpoints: PEM loading, key ids, key pairs and a node's keyring.

A key id names a public key without revealing anything: ``sha256:`` + the first 16 hex
digits of the SHA-256 of its DER SubjectPublicKeyInfo (:func:`key_id`; what a checkpoint's
``sealed-for`` lists and each JWE recipient's ``kid`` carries). Public keys are PEM
SubjectPublicKeyInfo; private keys are unencrypted PEM (PKCS#8, PKCS#1 or SEC1), as mounted
from a Kubernetes Secret. EC (P-256, P-384, P-521: the curves go-jose's ECDH-ES takes) and
RSA are accepted; :func:`generate_keypair` writes PKCS#8, which skopeo reads too (ocicrypt
reads a PEM private key as PKCS#8 or PKCS#1 only, not SEC1). Used by
:mod:`drivers.sealing.layers`, :mod:`drivers.sealing.signatures` and the node agent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

# ``Any``, not the unions they are: callers narrow with isinstance (a signer needs EC), and
# a union here would make every caller's narrowed list a type error.
PublicKey = Any  # ec.EllipticCurvePublicKey | rsa.RSAPublicKey
PrivateKey = Any  # ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

CURVES = ("secp256r1", "secp384r1", "secp521r1")
KINDS = ("ec", "rsa")


def _usable(key: object, *, what: str) -> None:
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        if key.curve.name not in CURVES:
            raise ValueError(f"the {what} is on curve {key.curve.name}; sealed checkpoints "
                             "use P-256, P-384 or P-521")
    elif not isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        raise ValueError(f"the {what} is a {type(key).__name__}; sealed checkpoints use EC "
                         "(P-256) or RSA keys")


def _pem(pem: bytes | str) -> bytes:
    return pem.encode() if isinstance(pem, str) else pem


def load_public_key(pem: bytes | str) -> PublicKey:
    """An EC or RSA public key from PEM SubjectPublicKeyInfo (``-----BEGIN PUBLIC KEY``);
    ``ValueError`` saying what was given instead."""
    try:
        key = serialization.load_pem_public_key(_pem(pem))
    except ValueError as exc:
        hint = (" (this is a private key: give its public half)"
                if b"PRIVATE KEY" in _pem(pem) else "")
        raise ValueError("the public key is not a PEM SubjectPublicKeyInfo "
                         f"('-----BEGIN PUBLIC KEY-----'){hint}") from exc
    _usable(key, what="public key")
    return key


def load_private_key(pem: bytes | str) -> PrivateKey:
    """An unencrypted EC or RSA private key from PEM (PKCS#8, PKCS#1 or SEC1);
    ``ValueError`` saying what to fix otherwise. The message never holds key material."""
    try:
        key = serialization.load_pem_private_key(_pem(pem), password=None)
    except TypeError as exc:  # a passphrase-protected PEM
        raise ValueError("the private key is passphrase-protected; mount it unencrypted "
                         "from a Secret") from exc
    except ValueError as exc:
        raise ValueError("the private key is not an unencrypted PEM private key (PKCS#8 "
                         "'PRIVATE KEY', PKCS#1 'RSA PRIVATE KEY' or SEC1 'EC PRIVATE KEY')"
                         ) from exc
    _usable(key, what="private key")
    return key


def public_half(key: PublicKey | PrivateKey) -> PublicKey:
    """The public key of a private key; a public key as it is."""
    if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        return key.public_key()
    return key


def key_id(key: PublicKey | PrivateKey) -> str:
    """``sha256:<16 hex>`` of the (public half's) DER SubjectPublicKeyInfo."""
    der = public_half(key).public_bytes(serialization.Encoding.DER,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


def generate_keypair(private_path: Path, public_path: Path, *, kind: str = "ec") -> str:
    """Write a new key pair, ``kind`` ``ec`` (P-256) or ``rsa`` (3072 bits): the private
    key PKCS#8 PEM with mode 0600 (even over an existing file), the public one SPKI PEM.
    Returns its key id."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: a key pair is 'ec' (P-256) or 'rsa'")
    key: PrivateKey = (ec.generate_private_key(ec.SECP256R1()) if kind == "ec"
                       else rsa.generate_private_key(public_exponent=65537, key_size=3072))
    private_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # O_CREAT's mode does not apply to an existing file
        out.write(body)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key)


@dataclass(frozen=True, repr=False)
class Keyring:
    """One party's keys: private keys that unseal layers, public keys to seal them for.

    Its ``repr`` shows key ids only, so a keyring in a log or a traceback leaks nothing.
    """

    decryption_keys: tuple[PrivateKey, ...] = ()
    recipients: tuple[PublicKey, ...] = ()

    @classmethod
    def from_pem(cls, *, private: Iterable[bytes | str] = (),
                 public: Iterable[bytes | str] = ()) -> Keyring:
        """From PEM texts; ``ValueError`` naming which one (by position) is unusable."""
        return cls(tuple(_each(load_private_key, private, "private key")),
                   tuple(_each(load_public_key, public, "recipient")))

    @classmethod
    def from_files(cls, *, private: Iterable[Path] = (),
                   public: Iterable[Path] = ()) -> Keyring:
        """From PEM files; ``ValueError`` naming the unusable file, ``OSError`` if one
        cannot be read."""
        return cls(tuple(_load_file(load_private_key, path) for path in private),
                   tuple(_load_file(load_public_key, path) for path in public))

    def ids(self) -> tuple[str, ...]:
        """The key ids on the ring, decryption keys first, each once."""
        return tuple(dict.fromkeys(key_id(k) for k in (*self.decryption_keys,
                                                       *self.recipients)))

    def __repr__(self) -> str:
        return (f"Keyring(decryption_keys={[key_id(k) for k in self.decryption_keys]}, "
                f"recipients={[key_id(k) for k in self.recipients]})")


def _each(load: Any, pems: Iterable[bytes | str], what: str) -> list[Any]:
    found = []
    for number, pem in enumerate(pems):
        try:
            found.append(load(pem))
        except ValueError as exc:
            raise ValueError(f"{what} {number}: {exc}") from exc
    return found


def _load_file(load: Callable[[bytes], Any], path: Path) -> Any:
    """``load`` of the file's bytes; a ``ValueError`` names the file."""
    try:
        return load(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
