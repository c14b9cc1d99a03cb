"""The sealing tests' shared pieces: running the tools we did not write (skopeo,
openssl), and a small image to sign or copy."""

from __future__ import annotations

import asyncio
import json

from drivers.registry.port import OCI_MANIFEST, Descriptor, Registry

TIMEOUT = 60  # seconds for one subprocess; a copy here takes a fraction of one


async def run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """The exit code and output (stdout and stderr) of ``args``, within ``TIMEOUT``
    (killed and waited for after it)."""
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(TIMEOUT):
            said, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, said.decode("utf-8", "replace")


OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


async def push_image(registry: Registry, repo: str, name: str) -> str:
    """A one-layer image tagged ``name`` (its layer differs per name); its digest."""
    layer = await registry.push_blob(repo, f"checkpoint {name}".encode(), media_type=OCI_LAYER)
    config = await registry.push_blob(repo, json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {},
         "rootfs": {"type": "layers", "diff_ids": [layer.digest]}}).encode(),
        media_type=OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": Descriptor(OCI_CONFIG, config.digest, config.size).to_json(),
                "layers": [Descriptor(OCI_LAYER, layer.digest, layer.size).to_json()]}
    return await registry.push_manifest(repo, json.dumps(manifest).encode(),
                                        media_type=OCI_MANIFEST, tag=name)
