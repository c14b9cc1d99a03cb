"""The images real nodes run, made here and pushed to a loopback registry over plain HTTP.

No builder daemon: an image is an uncompressed tar layer (its digest is its diff ID), a
config and an OCI manifest, pushed with the registry API's monolithic upload
(:func:`push_image`). Three kinds:

- :func:`push_pause_image`: the sandbox's ``/pause`` (scripts/ensure-realnode compiles it
  statically), ``FROM scratch``;
- :func:`push_busybox_image`: Debian's static busybox with a few applet links, the small
  test image;
- :func:`push_checkpoint_image`: a kubelet checkpoint archive as the one layer (the
  archive unpacked at ``/``), with the manifest annotation CRI-O looks for,
  ``io.kubernetes.cri-o.annotations.checkpoint.name=<container>``: a container whose
  image is this one is restored by CRI-O, not started.

Used by :mod:`.world` and the tests' world.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CHECKPOINT_NAME = "io.kubernetes.cri-o.annotations.checkpoint.name"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "cat", "echo", "ls", "true", "date", "seq")
TIMEOUT = 60.0


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    data: bytes | None = None  # in memory, or read from ``path``
    path: Path | None = None


def blob_of(data: bytes) -> Blob:
    return Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data)


def blob_of_file(path: Path) -> Blob:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return Blob("sha256:" + digest.hexdigest(), path.stat().st_size, path=path)


def rootfs_tar(files: Mapping[str, Path], *, links: Mapping[str, str] = {},
               dirs: Sequence[str] = ()) -> bytes:
    """A layer: ``files`` (path in the image → file on the host), symlinks, folders."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name, source in files.items():
            info = tar.gettarinfo(str(source), name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with source.open("rb") as f:
                tar.addfile(info, f)
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return out.getvalue()


def _request(method: str, url: str, *, body: Any = None, headers: Mapping[str, str] = {},
             ) -> tuple[int, Mapping[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        response.read()
        return response.status, response.headers


def push_blob(registry: str, repository: str, blob: Blob) -> None:
    base = f"http://{registry}/v2/{repository}/blobs"
    try:
        _request("HEAD", f"{base}/{blob.digest}")
        return  # already there
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code != 404:
            raise
    _status, headers = _request("POST", f"{base}/uploads/")
    location = headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    url = f"{location}{'&' if '?' in location else '?'}digest={blob.digest}"
    common = {"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)}
    if blob.data is not None:
        _request("PUT", url, body=blob.data, headers=common)
    else:
        assert blob.path is not None
        with blob.path.open("rb") as f:
            _request("PUT", url, body=f, headers=common)


def push_image(registry: str, repository: str, tag: str, layers: Sequence[Blob], *,
               config: Mapping[str, Any] | None = None,
               annotations: Mapping[str, str] | None = None, pinned: bool = False) -> str:
    """Push the layers (uncompressed tars), a config and the manifest; the reference (by
    tag, or by the manifest's digest when ``pinned``)."""
    image_config = {"architecture": "amd64", "os": "linux", "config": dict(config or {}),
                    "rootfs": {"type": "layers", "diff_ids": [b.digest for b in layers]},
                    "history": [{"created_by": "controlplane drivers.realnode"}
                                for _ in layers]}
    config_blob = blob_of(json.dumps(image_config, sort_keys=True).encode())
    for blob in (*layers, config_blob):
        push_blob(registry, repository, blob)
    manifest: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_blob.digest, "size": config_blob.size},
        "layers": [{"mediaType": LAYER, "digest": b.digest, "size": b.size} for b in layers]}
    if annotations:
        manifest["annotations"] = dict(annotations)
    body = json.dumps(manifest).encode()
    _request("PUT", f"http://{registry}/v2/{repository}/manifests/{tag}",
             body=body, headers={"Content-Type": MANIFEST})
    if pinned:
        return f"{registry}/{repository}@sha256:{hashlib.sha256(body).hexdigest()}"
    return f"{registry}/{repository}:{tag}"


def delete_image(ref: str) -> None:
    """Delete the manifest ``registry/repository@sha256:...`` from the registry."""
    name, _, digest = ref.partition("@")
    registry, _, repository = name.partition("/")
    _request("DELETE", f"http://{registry}/v2/{repository}/manifests/{digest}")


def push_pause_image(registry: str, pause: Path) -> str:
    layer = blob_of(rootfs_tar({"pause": pause}))
    return push_image(registry, "realnode/pause", "3.10", [layer],
                      config={"Entrypoint": ["/pause"]})


def push_busybox_image(registry: str) -> str:
    if not BUSYBOX.exists():
        raise RuntimeError(f"{BUSYBOX} is missing: run scripts/ensure-realnode "
                           "(it installs busybox-static)")
    layer = blob_of(rootfs_tar({"bin/busybox": BUSYBOX},
                               links={f"bin/{a}": "busybox" for a in APPLETS},
                               dirs=("bin", "tmp", "proc", "sys", "dev", "etc")))
    return push_image(registry, "realnode/busybox", "1", [layer],
                      config={"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})


def push_checkpoint_image(registry: str, archive: Path, *, container: str,
                          repository: str, tag: str, pinned: bool = False) -> str:
    """The kubelet's checkpoint archive as a checkpoint image CRI-O restores from."""
    return push_image(registry, repository, tag, [blob_of_file(archive)],
                      annotations={CHECKPOINT_NAME: container}, pinned=pinned)
