"""Our sealed layers and skopeo's are one format: each side opens the other's, through a
real registry (Debian's docker-registry on loopback) and Debian's skopeo (containers/image
with ocicrypt). skopeo is never skipped: missing, it FAILS, naming ``scripts/ensure-skopeo``.

Pins: an image whose one layer we sealed for an EC and an RSA key is copied by ``skopeo
copy --decryption-key`` with either key to the plain tar, byte for byte, the ``+encrypted``
and the ocicrypt annotations gone (our ``kid`` headers do not bother go-jose); without a
key skopeo copies the ciphertext as it is, still ``+encrypted``; with another key it
fails, naming the layer, and writes no plain layer. The other way: a plain image skopeo
seals for our two keys (``--encryption-key jwe:``) into a registry comes back gzip inside
(skopeo compresses before it seals), names no kid, and unseals with either key to the gzip
of our tar; its sealed ``digest`` is the tar's, not the unsealed bytes' — why
``decrypt_layer`` checks only a digest its caller trusts.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from jwcrypto import jwe, jwk

from drivers.registry import RegistryClient, RegistrySettings
from drivers.registry.port import OCI_MANIFEST, Descriptor
from drivers.sealing.errors import NotForUs
from drivers.sealing.layers import KEYS_JWE, PUBOPTS, decrypt_layer, encrypt_layer, sealed_for
from tests.registry.servers import run_registry
from tests.sealing.parties import Party, party
from tests.sealing.tools import run

ENSURE = "scripts/ensure-skopeo"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
EC, RSA, STRANGER = party("ec"), party("rsa", "rsa"), party("stranger")


@dataclass
class Skopeo:
    """skopeo with its own policy, auth file and registries config: the host's are unused."""

    home: Path
    env: dict[str, str]

    async def copy(self, *args: str) -> tuple[int, str]:
        """``skopeo copy ARGS``: the exit code and the output (stdout and stderr), within
        ``tools.TIMEOUT`` (killed and waited for after it)."""
        return await run("skopeo", "--registries.d", str(self.home / "registries.d"), "copy",
                         "--policy", str(self.home / "policy.json"), *args, env=self.env)

    def key(self, who: Party, name: str) -> tuple[Path, Path]:
        return who.write(self.home / "keys", name)


@pytest.fixture
def skopeo(tmp_path: Path) -> Skopeo:
    if shutil.which("skopeo") is None:
        pytest.fail(f"skopeo is missing: run {ENSURE} (it installs Debian's skopeo); the "
                    "interoperability tests are never skipped", pytrace=False)
    home = tmp_path / "skopeo"
    (home / "registries.d").mkdir(parents=True)
    (home / "tmp").mkdir()
    (home / "policy.json").write_text(json.dumps(
        {"default": [{"type": "insecureAcceptAnything"}]}))
    (home / "auth.json").write_text(json.dumps({"auths": {}}))
    (home / "registries.conf").write_text("")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "TMPDIR": str(home / "tmp"), "REGISTRY_AUTH_FILE": str(home / "auth.json"),
           "CONTAINERS_REGISTRIES_CONF": str(home / "registries.conf")}
    return Skopeo(home, env)


@dataclass
class Registry:
    host: str
    client: RegistryClient


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with run_registry(tmp_path / "registry", delete=True) as server:
        client = RegistryClient(RegistrySettings(request_timeout=10, attempts=1))
        try:
            yield Registry(server.host, client)
        finally:
            await client.close()


def write_tar(path: Path) -> bytes:
    """A small real tar (what a checkpoint archive is), compressible like one."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("checkpoint/pages-1.img", "config.dump"):
            data = hashlib.shake_256(name.encode()).digest(48 * 1024) + b"\0" * 32 * 1024
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


async def push_image(registry: Registry, repo: str, layer: Path, *, media_type: str,
                     diff_id: str, annotations: dict[str, str] | None = None) -> None:
    """One image, one layer: its config's diff_ids name the plain layer (as ocicrypt's)."""
    blob = await registry.client.push_blob(repo, layer, media_type=media_type)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_descriptor = await registry.client.push_blob(repo, config, media_type=OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": config_descriptor.to_json(),
                "layers": [Descriptor(media_type, blob.digest, blob.size,
                                      annotations or {}).to_json()]}
    await registry.client.push_manifest(repo, json.dumps(manifest).encode(),
                                        media_type=OCI_MANIFEST, tag="v1")


def copied_layer(out: Path) -> tuple[dict[str, object], bytes]:
    """The one layer of a ``dir:`` copy: its descriptor and its bytes."""
    layer = json.loads((out / "manifest.json").read_text())["layers"][0]
    return layer, (out / layer["digest"].removeprefix("sha256:")).read_bytes()


async def test_skopeo_unseals_our_layer_with_either_recipients_key(
        tmp_path: Path, registry: Registry, skopeo: Skopeo) -> None:
    tar = write_tar(tmp_path / "layer.tar")
    made = encrypt_layer(tmp_path / "layer.tar", tmp_path / "layer.sealed",
                         [EC.public, RSA.public])
    repo = f"{registry.host}/sealed/app"
    await push_image(registry, repo, tmp_path / "layer.sealed",
                     media_type=OCI_LAYER + "+encrypted", diff_id=made.plain_digest,
                     annotations=made.annotations)
    for who in (EC, RSA):
        private, _ = skopeo.key(who, who.kid[7:])
        out = tmp_path / f"out-{who.kid[7:]}"
        code, said = await skopeo.copy("--src-tls-verify=false", "--decryption-key",
                                       str(private), f"docker://{repo}:v1", f"dir:{out}")
        assert code == 0, said
        layer, body = copied_layer(out)
        assert body == tar
        assert (layer["mediaType"], layer["digest"]) == (OCI_LAYER, made.plain_digest)
        assert not layer.get("annotations")


async def test_skopeo_copies_ciphertext_without_a_key_and_refuses_another_key(
        tmp_path: Path, registry: Registry, skopeo: Skopeo) -> None:
    tar = write_tar(tmp_path / "layer.tar")
    made = encrypt_layer(tmp_path / "layer.tar", tmp_path / "layer.sealed", [EC.public])
    repo = f"{registry.host}/sealed/app"
    await push_image(registry, repo, tmp_path / "layer.sealed",
                     media_type=OCI_LAYER + "+encrypted", diff_id=made.plain_digest,
                     annotations=made.annotations)

    keyless = tmp_path / "keyless"
    code, said = await skopeo.copy("--src-tls-verify=false", f"docker://{repo}:v1",
                                   f"dir:{keyless}")
    assert code == 0, said
    layer, body = copied_layer(keyless)
    assert body == (tmp_path / "layer.sealed").read_bytes() != tar
    assert layer["mediaType"] == OCI_LAYER + "+encrypted"
    assert layer["annotations"] == made.annotations

    private, _ = skopeo.key(STRANGER, "stranger")
    refused = tmp_path / "refused"
    code, said = await skopeo.copy("--src-tls-verify=false", "--decryption-key", str(private),
                                   f"docker://{repo}:v1", f"dir:{refused}")
    assert code != 0
    assert f"decrypting layer {made.digest}" in said
    written = [p.read_bytes() for p in refused.rglob("*") if p.is_file()]
    assert tar not in written


async def test_we_unseal_what_skopeo_sealed_for_our_two_keys(
        tmp_path: Path, registry: Registry, skopeo: Skopeo) -> None:
    tar = write_tar(tmp_path / "layer.tar")
    tar_digest = "sha256:" + hashlib.sha256(tar).hexdigest()
    await push_image(registry, f"{registry.host}/plain/app", tmp_path / "layer.tar",
                     media_type=OCI_LAYER, diff_id=tar_digest)
    _, ec_public = skopeo.key(EC, "ec")
    _, rsa_public = skopeo.key(RSA, "rsa")
    code, said = await skopeo.copy(
        "--src-tls-verify=false", "--dest-tls-verify=false",
        "--encryption-key", f"jwe:{ec_public}", "--encryption-key", f"jwe:{rsa_public}",
        f"docker://{registry.host}/plain/app:v1", f"docker://{registry.host}/theirs/app:v1")
    assert code == 0, said

    repo = f"{registry.host}/theirs/app"
    manifest = json.loads((await registry.client.get_manifest(repo, "v1")).body)
    layer = manifest["layers"][0]
    assert layer["mediaType"] == OCI_LAYER + "+gzip+encrypted"
    annotations = layer["annotations"]
    assert {KEYS_JWE, PUBOPTS} <= set(annotations)
    assert sealed_for(annotations) == ()
    sealed = tmp_path / "theirs.sealed"
    await registry.client.get_blob(repo, layer["digest"], sealed)

    for who in (EC, RSA):
        out = tmp_path / f"theirs-{who.kid[7:]}.tar.gz"
        unsealed = decrypt_layer(sealed, out, annotations, [who.private])
        assert gzip.decompress(out.read_bytes()) == tar
        assert unsealed == "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest()

    opened = jwe.JWE()
    opened.deserialize(base64.b64decode(annotations[KEYS_JWE]).decode(),
                       key=jwk.JWK.from_pyca(EC.private))
    assert json.loads(opened.payload)["digest"] == tar_digest != unsealed

    with pytest.raises(NotForUs) as refused:
        decrypt_layer(sealed, tmp_path / "never.tar", annotations, [STRANGER.private])
    assert refused.value.sealed_for == ()
    assert not (tmp_path / "never.tar").exists()
