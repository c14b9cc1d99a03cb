"""Sealed layers in ocicrypt's format: what unseals, what is refused, and what is left behind.

Pins: a layer sealed for an RSA and an EC recipient unseals, for each, to the same bytes
and digest (3 MiB: chunk boundaries crossed); the kids name the recipients and are read
without a key; a key it is not sealed for is refused with ``NotForUs`` naming them; a
flipped ciphertext byte, the HMAC of another layer or a plain digest other than the
expected one is ``Tampered`` and leaves no plain file (not even a partial one); missing
or garbled annotations are ``BadSealedLayer`` naming the annotation; a second JWE joined
with a comma (how ocicrypt adds recipients) is opened. skopeo's side: test_skopeo_layers.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from jwcrypto import jwe, jwk

from drivers.sealing.errors import BadSealedLayer, NotForUs, Tampered
from drivers.sealing.layers import (
    CHUNK,
    KEYS_JWE,
    PUBOPTS,
    SealedLayer,
    decrypt_layer,
    encrypt_layer,
    is_encrypted,
    sealed_for,
)
from tests.sealing.parties import Party, party

EC, RSA, STRANGER = party("ec"), party("rsa", "rsa"), party("stranger")


def plain_file(folder: Path, size: int, name: str = "layer.tar") -> Path:
    """Deterministic bytes that differ from chunk to chunk (a counter would repeat)."""
    path = folder / name
    path.write_bytes(hashlib.shake_256(name.encode()).digest(size))
    return path


def seal(folder: Path, size: int = 4096, recipients: tuple[Party, ...] = (EC, RSA),
         name: str = "layer.tar") -> tuple[Path, Path, SealedLayer]:
    plain = plain_file(folder, size, name)
    sealed = folder / f"{name}.sealed"
    return plain, sealed, encrypt_layer(plain, sealed, [p.public for p in recipients])


def leftovers(folder: Path, *keep: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p not in keep)


def test_each_recipient_unseals_the_same_bytes_across_chunk_boundaries(tmp_path: Path) -> None:
    """RSA and EC recipients each get the plain layer back, byte for byte (3 MiB + 17)."""
    plain, sealed, made = seal(tmp_path, 3 * CHUNK + 17)
    body = plain.read_bytes()
    assert sealed.read_bytes() != body
    assert (made.size, made.plain_size) == (len(body), len(body))
    assert made.digest == "sha256:" + hashlib.sha256(sealed.read_bytes()).hexdigest()
    assert made.plain_digest == "sha256:" + hashlib.sha256(body).hexdigest()
    for who in (EC, RSA):
        out = tmp_path / f"out-{who.kid[7:]}.tar"
        assert decrypt_layer(sealed, out, made.annotations, [who.private],
                             expected_digest=made.plain_digest) == made.plain_digest
        assert out.read_bytes() == body
        assert out.stat().st_mode & 0o777 == 0o600


def test_an_empty_layer_round_trips(tmp_path: Path) -> None:
    _, sealed, made = seal(tmp_path, 0)
    out = tmp_path / "out.tar"
    assert decrypt_layer(sealed, out, made.annotations, [EC.private]) == made.plain_digest
    assert out.read_bytes() == b""


def test_the_annotations_are_ocicrypts_with_the_kids_readable_without_a_key(
        tmp_path: Path) -> None:
    """pubopts and the JWE are what ocicrypt writes; each recipient carries its key id."""
    _, _, made = seal(tmp_path)
    assert set(made.annotations) == {KEYS_JWE, PUBOPTS}
    public = json.loads(base64.b64decode(made.annotations[PUBOPTS], validate=True))
    assert public["cipher"] == "AES_256_CTR_HMAC_SHA256"
    assert len(base64.b64decode(public["hmac"], validate=True)) == 32
    assert public["cipheroptions"] == {}
    token = json.loads(base64.b64decode(made.annotations[KEYS_JWE], validate=True))
    assert [r["header"]["alg"] for r in token["recipients"]] == ["ECDH-ES+A256KW", "RSA-OAEP"]
    assert sealed_for(made.annotations) == (EC.kid, RSA.kid)
    assert is_encrypted("application/vnd.oci.image.layer.v1.tar+encrypted")
    assert not is_encrypted("application/vnd.oci.image.layer.v1.tar")


def test_a_key_it_is_not_sealed_for_is_refused_naming_the_recipients(tmp_path: Path) -> None:
    _, sealed, made = seal(tmp_path)
    out = tmp_path / "out.tar"
    with pytest.raises(NotForUs) as refused:
        decrypt_layer(sealed, out, made.annotations, [STRANGER.private])
    assert EC.kid in str(refused.value)
    assert RSA.kid in str(refused.value)
    assert STRANGER.kid in str(refused.value)
    assert refused.value.sealed_for == (EC.kid, RSA.kid)
    assert leftovers(tmp_path, sealed) == ["layer.tar"]


def test_the_first_key_that_opens_is_used(tmp_path: Path) -> None:
    _, sealed, made = seal(tmp_path, recipients=(RSA,))
    out = tmp_path / "out.tar"
    assert decrypt_layer(sealed, out, made.annotations,
                         [STRANGER.private, RSA.private]) == made.plain_digest


def test_a_flipped_ciphertext_byte_is_tampered_and_leaves_no_plain_file(tmp_path: Path) -> None:
    """The HMAC is over the ciphertext, checked at the end: nothing unchecked stays."""
    plain, sealed, made = seal(tmp_path, CHUNK + 100)
    body = bytearray(sealed.read_bytes())
    body[CHUNK + 3] ^= 0x01
    sealed.write_bytes(bytes(body))
    out = tmp_path / "out.tar"
    with pytest.raises(Tampered, match="HMAC"):
        decrypt_layer(sealed, out, made.annotations, [EC.private])
    assert leftovers(tmp_path, plain, sealed) == []


def test_the_hmac_of_another_layer_is_tampered(tmp_path: Path) -> None:
    """pubopts swapped for another layer's (a valid HMAC, of other bytes) is refused."""
    _, sealed, made = seal(tmp_path)
    _, _, other = seal(tmp_path, name="other.tar")
    swapped = {**made.annotations, PUBOPTS: other.annotations[PUBOPTS]}
    out = tmp_path / "out.tar"
    with pytest.raises(Tampered, match="HMAC"):
        decrypt_layer(sealed, out, swapped, [EC.private])
    assert not out.exists()
    assert not (tmp_path / "out.tar.partial").exists()


def test_a_plain_digest_other_than_the_expected_one_is_tampered(tmp_path: Path) -> None:
    _, sealed, made = seal(tmp_path)
    out = tmp_path / "out.tar"
    with pytest.raises(Tampered, match="sha256:0000"):
        decrypt_layer(sealed, out, made.annotations, [EC.private],
                      expected_digest="sha256:" + "0" * 64)
    assert not out.exists()
    assert not (tmp_path / "out.tar.partial").exists()


def test_a_garbled_jwe_sealed_for_a_key_given_is_tampered_not_foreign(tmp_path: Path) -> None:
    """The kid says the layer is ours; if our key still does not open it, it was edited."""
    _, sealed, made = seal(tmp_path, recipients=(EC,))
    token = json.loads(base64.b64decode(made.annotations[KEYS_JWE]))
    token["ciphertext"] = token["ciphertext"][::-1]
    garbled = {**made.annotations,
               KEYS_JWE: base64.b64encode(json.dumps(token).encode()).decode()}
    with pytest.raises(Tampered, match=EC.kid):
        decrypt_layer(sealed, tmp_path / "out.tar", garbled, [EC.private])


@pytest.mark.parametrize(("edit", "named"), [
    ({KEYS_JWE: ""}, KEYS_JWE),
    ({KEYS_JWE: "not base64!"}, KEYS_JWE),
    ({KEYS_JWE: base64.b64encode(b"[1]").decode()}, KEYS_JWE),
    ({PUBOPTS: ""}, PUBOPTS),
    ({PUBOPTS: base64.b64encode(b'{"cipher":"AES_128_GCM","hmac":"AA=="}').decode()},
     "AES_128_GCM"),
    ({PUBOPTS: base64.b64encode(b'{"cipher":"AES_256_CTR_HMAC_SHA256"}').decode()}, "hmac"),
])
def test_missing_or_garbled_annotations_are_bad_naming_what(
        tmp_path: Path, edit: dict[str, str], named: str) -> None:
    _, sealed, made = seal(tmp_path)
    with pytest.raises(BadSealedLayer, match=named.replace(".", r"\.")):
        decrypt_layer(sealed, tmp_path / "out.tar", {**made.annotations, **edit},
                      [EC.private])
    assert not (tmp_path / "out.tar").exists()


def test_recipients_are_required(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one recipient"):
        encrypt_layer(plain_file(tmp_path, 10), tmp_path / "sealed", [])


def test_a_second_jwe_joined_with_a_comma_is_opened(tmp_path: Path) -> None:
    """ocicrypt adds recipients to a sealed layer by appending ``,<base64 JWE>``."""
    _, sealed, made = seal(tmp_path, recipients=(EC,))
    first = jwe.JWE()
    first.deserialize(base64.b64decode(made.annotations[KEYS_JWE]).decode(),
                      key=jwk.JWK.from_pyca(EC.private))
    second = jwe.JWE(first.payload, protected='{"enc":"A256GCM"}')
    second.add_recipient(jwk.JWK.from_pyca(RSA.public), header='{"alg":"RSA-OAEP"}')
    joined = {**made.annotations, KEYS_JWE: made.annotations[KEYS_JWE] + ","
              + base64.b64encode(second.serialize().encode()).decode()}
    out = tmp_path / "out.tar"
    assert decrypt_layer(sealed, out, joined, [RSA.private]) == made.plain_digest
    assert sealed_for(joined) == (EC.kid,)
