"""The archive a lazy migration hands from source to target, in its three forms.

- :func:`write_handoff` (source): what ``podman container checkpoint --export`` would
  write, taken from the container's bundle while CRIU's page server waits: podman exports
  its own only after the last page was served. It holds ``config.dump``, ``spec.dump``,
  CRIU's images (the memory is not there: a few non-lazy pages at most), the container's
  log, ``/dev/shm`` and the root file system's changes (``rootfs-diff.tar``,
  ``deleted.files``, as podman's ``CRCreateRootFsDiffTar`` makes them from ``podman
  diff``). Not there: CRIU's statistics and ``network.status`` (podman writes them after
  runc returns; a restore under a new name does not read the latter).
- :func:`extract_images` (target): CRIU's images alone, for the ``criu lazy-pages``
  daemon (podman removes its own copy once the container runs).
- :func:`with_request` (target): a copy with the wrapper's restore request in it:
  podman extracts the archive into the new container's bundle, where
  :mod:`drivers.podman.lazy_runc` finds it.

Called by :mod:`drivers.podman.lazy`; file work only, run in a thread.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from drivers.podman.archive import make_portable
from drivers.podman.lazy_runc import REQUEST

#: The bundle's files and folders the archive takes as they are (podman's exportCheckpoint).
BUNDLE_FILES = ("config.dump", "spec.dump", "ctr.log", "artifacts", "checkpoint")


def write_handoff(bundle: Path, archive: Path, *, changes: dict[str, list[str]],
                  mountpoint: Path) -> Path:
    """Write the import archive of the container whose bundle is ``bundle`` (frozen by a
    lazy dump); ``changes``: ``podman diff --format json``'s, files taken from the
    container's ``mountpoint``."""
    staging = archive.with_suffix(".parts")
    staging.mkdir()
    try:
        with tarfile.open(archive, "w") as tar:
            for name in BUNDLE_FILES:
                if (bundle / name).exists():
                    tar.add(bundle / name, name)
            shm = _shm_dir(bundle)
            if shm is not None and shm.is_dir():
                with tarfile.open(staging / "devshm.tar", "w") as inner:
                    inner.add(shm, ".")
                tar.add(staging / "devshm.tar", "devshm-checkpoint.tar")
            files = [*(changes.get("added") or []),
                     *(p for p in changes.get("changed") or []
                       if not (mountpoint / p.lstrip("/")).is_dir())]
            if files:
                with tarfile.open(staging / "rootfs.tar", "w") as inner:
                    for path in files:
                        inner.add(mountpoint / path.lstrip("/"), path.lstrip("/"),
                                  recursive=False)
                tar.add(staging / "rootfs.tar", "rootfs-diff.tar")
            if changes.get("deleted"):
                _add_bytes(tar, "deleted.files", json.dumps(changes["deleted"]).encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    make_portable(archive)
    return archive


def _shm_dir(bundle: Path) -> Path | None:
    shm = json.loads((bundle / "config.dump").read_text()).get("ShmDir")
    return Path(shm) if shm else None


def extract_images(archive: Path, images: Path) -> None:
    """Extract the archive's CRIU images (``checkpoint/``) into ``images``."""
    images.mkdir(parents=True)
    with tarfile.open(archive, "r:") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith("checkpoint/"):
                member.name = member.name.removeprefix("checkpoint/")
                tar.extract(member, images, filter="data")


def with_request(archive: Path, copy: Path, socket: Path) -> Path:
    """Copy ``archive`` to ``copy`` with a request to restore lazily from the daemon
    listening on ``socket``."""
    shutil.copyfile(archive, copy)
    with tarfile.open(copy, "a") as tar:
        _add_bytes(tar, REQUEST, json.dumps({"fetch": str(socket)}).encode())
    return copy


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    tar.addfile(info, io.BytesIO(data))
