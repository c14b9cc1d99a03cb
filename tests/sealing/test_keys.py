"""Keys of sealed checkpoints: loading, key ids, key pairs on disk, a keyring.

Pins: a private key and its public half have one key id (``sha256:`` + 16 hex); PKCS#8,
PKCS#1 and SEC1 private keys load, a passphrase-protected one is refused saying to mount
it unencrypted; a generated private key file is 0600 even over a looser existing file; a
keyring built from PEM names its keys by id and its repr shows nothing but ids.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from drivers.sealing.keys import (
    Keyring,
    PrivateKey,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
)
from tests.sealing.parties import Party, party

EC, RSA = party("ec"), party("rsa", "rsa")


def pem(key: PrivateKey, fmt: serialization.PrivateFormat,
        encryption: serialization.KeySerializationEncryption | None = None) -> bytes:
    return bytes(key.private_bytes(serialization.Encoding.PEM, fmt,
                                   encryption or serialization.NoEncryption()))


def test_a_private_key_and_its_public_half_share_one_key_id(tmp_path: Path) -> None:
    _, public = EC.write(tmp_path, "ec")
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", EC.kid)
    assert key_id(load_public_key(public.read_bytes())) == key_id(EC.private) == EC.kid


@pytest.mark.parametrize(("who", "fmt"), [
    (EC, serialization.PrivateFormat.PKCS8),
    (EC, serialization.PrivateFormat.TraditionalOpenSSL),  # SEC1
    (RSA, serialization.PrivateFormat.TraditionalOpenSSL),  # PKCS#1
])
def test_pkcs8_pkcs1_and_sec1_private_keys_load(who: Party,
                                                fmt: serialization.PrivateFormat) -> None:
    assert key_id(load_private_key(pem(who.private, fmt))) == who.kid


def test_a_passphrase_protected_key_is_refused_saying_to_mount_it_unencrypted() -> None:
    locked = pem(EC.private, serialization.PrivateFormat.PKCS8,
                 serialization.BestAvailableEncryption(b"secret"))
    with pytest.raises(ValueError, match="unencrypted"):
        load_private_key(locked)


def test_a_private_key_given_as_public_is_refused_naming_the_mistake() -> None:
    with pytest.raises(ValueError, match="public half"):
        load_public_key(pem(EC.private, serialization.PrivateFormat.PKCS8))


def test_a_generated_private_key_is_0600_even_over_an_existing_file(tmp_path: Path) -> None:
    private, public = tmp_path / "keys" / "k.pem", tmp_path / "keys" / "k.pub"
    private.parent.mkdir()
    private.write_text("old")
    private.chmod(0o644)
    kid = generate_keypair(private, public)
    assert private.stat().st_mode & 0o777 == 0o600
    assert key_id(load_private_key(private.read_bytes())) == kid
    assert key_id(load_public_key(public.read_bytes())) == kid
    with pytest.raises(ValueError, match="'ec'"):
        generate_keypair(private, public, kind="dsa")


def test_a_keyring_names_its_keys_by_id_and_shows_nothing_else(tmp_path: Path) -> None:
    private, public = EC.write(tmp_path, "ec")
    _, rsa_public = RSA.write(tmp_path, "rsa")
    ring = Keyring.from_pem(private=[private.read_text()],
                            public=[public.read_bytes(), rsa_public.read_bytes()])
    assert ring.ids() == (EC.kid, RSA.kid)
    assert repr(ring) == f"Keyring(decryption_keys=['{EC.kid}'], recipients=['{EC.kid}', " \
                         f"'{RSA.kid}'])"
    assert Keyring.from_files(private=[private]).ids() == (EC.kid,)
    with pytest.raises(ValueError, match="recipient 1"):
        Keyring.from_pem(public=[public.read_bytes(), b"junk"])
