"""Keys of sealed checkpoints: PEM loading, key ids, and generating a key pair.

A key id names a public key without revealing anything: ``sha256:`` + the first 16 hex
digits of the SHA-256 of its DER SubjectPublicKeyInfo (what ``sealed-for`` lists and
each JWE recipient's ``kid`` carries). Private keys are unencrypted PEM (PKCS#8, PKCS#1
or SEC1), as mounted from a Kubernetes Secret; EC P-256 is the default kind (the curve
cosign and ocicrypt's ECDH-ES use), RSA is accepted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

PublicKey = Any  # ec.EllipticCurvePublicKey | rsa.RSAPublicKey
PrivateKey = Any  # ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def load_public_key(pem: bytes) -> PublicKey:
    """An EC or RSA public key from PEM; ``ValueError`` naming what it got otherwise."""
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise ValueError(f"a {type(key).__name__} is not a key sealed checkpoints use "
                         "(EC P-256 or RSA)")
    return key


def load_private_key(pem: bytes) -> PrivateKey:
    """An unencrypted EC or RSA private key from PEM (``ValueError`` otherwise)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError as exc:  # encrypted PEM
        raise ValueError("the private key is passphrase-protected; mount it unencrypted "
                         "from a Secret") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"a {type(key).__name__} is not a key sealed checkpoints use "
                         "(EC P-256 or RSA)")
    return key


def key_id(key: PublicKey | PrivateKey) -> str:
    """``sha256:<16 hex>`` of the public key's DER SubjectPublicKeyInfo."""
    public = key.public_key() if hasattr(key, "private_bytes") else key
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


def generate_keypair(private_path: Path, public_path: Path, *, kind: str = "ec") -> str:
    """Write a new key pair (the private file 0600, created so); returns its key id."""
    key: PrivateKey = (ec.generate_private_key(ec.SECP256R1()) if kind == "ec"
                       else rsa.generate_private_key(public_exponent=65537, key_size=3072))
    private_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(body)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key)
