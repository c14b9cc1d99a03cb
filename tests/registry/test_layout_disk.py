"""The on-disk OCI layout beyond the shared contract: atomic writes, locking, GC, format.

Pins: ``index.json`` stays a valid index while several processes push to one repository
at once (the agent and the control plane share the layout in the embedded default); a
blob that does not match its digest is never delivered, and leaves no partial file; a
delete collects unreferenced blobs but spares young ones (a push in flight) and anything
another manifest still references; the directory is a standard OCI image layout.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from drivers.registry import OciLayout
from drivers.registry.errors import RegistryBadResponse
from drivers.registry.port import OCI_MANIFEST, Descriptor

REPO = "localhost:5000/team/app"
PUSHER = f"""
import asyncio, json, sys
from drivers.registry import OciLayout
from drivers.registry.port import OCI_MANIFEST

async def main(root, who):
    layout = OciLayout(root)
    for i in range(15):
        layer = await layout.push_blob({REPO!r}, f"{{who}}-{{i}}".encode())
        body = json.dumps({{"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "layers": [layer.to_json()],
                           "annotations": {{"who": who, "i": str(i)}}}}).encode()
        await layout.push_manifest({REPO!r}, body, media_type=OCI_MANIFEST,
                                   tag=f"{{who}}-{{i}}")

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def manifest(layout: OciLayout, tag: str, *layers: bytes) -> str:
    listed = [(await layout.push_blob(REPO, data)).to_json() for data in layers]
    config = await layout.push_blob(REPO, b"{}")
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": Descriptor("application/vnd.oci.image.config.v1+json",
                                            config.digest, config.size).to_json(),
                       "layers": listed}).encode()
    return await layout.push_manifest(REPO, body, media_type=OCI_MANIFEST, tag=tag)


async def test_pushes_from_several_processes_keep_every_tag(tmp_path: Path) -> None:
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", PUSHER,
                                                  str(tmp_path), who)
             for who in ("agent-a", "agent-b", "agent-c")]
    assert [await p.wait() for p in procs] == [0, 0, 0]
    layout = OciLayout(tmp_path)
    index = json.loads((layout.layout_dir(REPO) / "index.json").read_text())
    assert len(index["manifests"]) == 45
    for who in ("agent-a", "agent-b", "agent-c"):
        for i in range(15):
            resolved = await layout.resolve(REPO, f"{who}-{i}")
            assert resolved is not None
            assert resolved.annotations == {"who": who, "i": str(i)}


async def test_a_corrupt_blob_is_refused_and_leaves_no_partial_file(tmp_path: Path) -> None:
    layout = OciLayout(tmp_path / "oci")
    blob = await layout.push_blob(REPO, b"the real state")
    stored = layout.layout_dir(REPO) / "blobs" / "sha256" / blob.digest.split(":")[1]
    stored.write_bytes(b"bit rot")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RegistryBadResponse):
        await layout.get_blob(REPO, blob.digest, out / "state.tar")
    assert list(out.iterdir()) == []


async def test_delete_collects_old_unreferenced_blobs_only(tmp_path: Path) -> None:
    layout = OciLayout(tmp_path, gc_grace=3600)
    blobs = layout.layout_dir(REPO) / "blobs" / "sha256"
    gone = await manifest(layout, "gone", b"only-in-gone", b"shared")
    await manifest(layout, "kept", b"shared")
    young = await layout.push_blob(REPO, b"pushed-just-now")  # a push in flight
    only = (await layout.push_blob(REPO, b"only-in-gone")).digest.split(":")[1]
    old = os.stat(blobs / only).st_mtime - 7200
    os.utime(blobs / only, (old, old))
    os.utime(blobs / gone.split(":")[1], (old, old))
    await layout.delete_manifest(REPO, gone)
    names = {p.name for p in blobs.iterdir()}
    assert only not in names  # old and unreferenced: collected
    assert gone.split(":")[1] not in names  # the deleted manifest itself
    assert young.digest.split(":")[1] in names  # young: spared
    kept = await layout.resolve(REPO, "kept")
    assert kept is not None
    out = tmp_path / "shared"
    shared = (await layout.push_blob(REPO, b"shared")).digest
    assert await layout.get_blob(REPO, shared, out) == len(b"shared")


async def test_the_directory_is_a_standard_oci_image_layout(tmp_path: Path) -> None:
    layout = OciLayout(tmp_path)
    digest = await manifest(layout, "v1", b"layer")
    where = tmp_path / "localhost_5000" / "team" / "app"
    assert json.loads((where / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((where / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index["manifests"] == [{"mediaType": OCI_MANIFEST, "digest": digest,
                                   "size": (where / "blobs" / "sha256" /
                                            digest.split(":")[1]).stat().st_size,
                                   "annotations": {"org.opencontainers.image.ref.name": "v1"}}]
    assert not [p for p in where.rglob(".*") if p.name != ".lock"]  # no temp files left
