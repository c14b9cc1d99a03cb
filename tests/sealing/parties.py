"""Key pairs the sealing tests seal for, made once per test process (RSA takes a while).

Used by ``test_layers.py``, ``test_keys.py`` and ``test_skopeo_layers.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from drivers.sealing.keys import PrivateKey, PublicKey, key_id


@dataclass(frozen=True)
class Party:
    """A recipient: its private key (to unseal), public key (to seal for) and key id."""

    private: PrivateKey
    public: PublicKey
    kid: str

    def write(self, folder: Path, name: str) -> tuple[Path, Path]:
        """``<name>.pem`` (PKCS#8, unencrypted) and ``<name>.pub`` (SPKI) in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        private, public = folder / f"{name}.pem", folder / f"{name}.pub"
        private.write_bytes(self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        public.write_bytes(self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        return private, public


@functools.cache
def party(name: str, kind: str = "ec") -> Party:
    """The same key pair for the same ``name`` within a test process."""
    key: PrivateKey = (ec.generate_private_key(ec.SECP256R1()) if kind == "ec"
                       else rsa.generate_private_key(public_exponent=65537, key_size=2048))
    return Party(key, key.public_key(), key_id(key))
