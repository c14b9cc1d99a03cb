"""The :class:`~drivers.registry.port.Registry` over OCI image layouts on disk (embedded default).

``root/<host>/<repository>/`` is one OCI image layout per repository (``:`` in the host
becomes ``_``): ``oci-layout``, ``index.json`` (its ``manifests`` list; a tag is the
``org.opencontainers.image.ref.name`` annotation of an entry) and ``blobs/sha256/<hex>``.
Other OCI tools (skopeo, oras, crane) read it as ``oci:<dir>:<tag>``.

Writes are atomic and safe across processes (the agent pushes while the control plane
probes): a blob or ``index.json`` is written to a temporary file in the same directory,
fsynced and renamed into place; every read-modify-write of ``index.json`` holds an
exclusive ``flock`` on ``<layout>/.lock``. Readers never lock: a rename is atomic.

A manifest exists when ``index.json`` lists it, by tag or by digest; a tag moved to
another manifest leaves the old one listed untagged, so it still resolves by digest, as
in a registry. ``delete_manifest`` unlists it (405 ``RegistryUnsupported`` when built
with ``allow_delete=False``, to mirror a registry with deletes disabled) and collects
blobs nothing lists any more, sparing those younger than ``gc_grace`` seconds (a push in
flight writes its blobs before its manifest). Disk work runs in threads under a timeout;
``PermissionError`` is ``RegistryForbidden``, other ``OSError`` ``RegistryUnreachable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from controlplane.engine.decider import InvalidSpec
from controlplane.machines.base.refs import is_valid_tag, parse_repository
from drivers.registry.client import is_digest
from drivers.registry.errors import (
    RegistryBadRequest,
    RegistryBadResponse,
    RegistryError,
    RegistryForbidden,
    RegistryNotFound,
    RegistryTimeout,
    RegistryUnreachable,
    RegistryUnsupported,
)
from drivers.registry.manifests import manifest_annotations, parse_manifest, referenced_digests
from drivers.registry.port import OCI_INDEX, OCI_MANIFEST, Descriptor, Manifest, Resolved

REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_VERSION = {"imageLayoutVersion": "1.0.0"}
T = TypeVar("T")


class OciLayout:
    """Repositories as OCI image layouts under ``root``."""

    def __init__(self, root: Path | str, *, allow_delete: bool = True, timeout: float = 60.0,
                 gc_grace: float = 3600.0) -> None:
        self.root = Path(root)
        self.allow_delete = allow_delete
        self.timeout = timeout
        self.gc_grace = gc_grace

    async def close(self) -> None:
        return None

    def layout_dir(self, repository: str) -> Path:
        try:
            name = parse_repository(repository, field="repository")
        except InvalidSpec as exc:
            raise RegistryBadRequest(str(exc)) from exc
        host, _, path = name.partition("/")
        return self.root / host.replace(":", "_") / path

    # --- the port ------------------------------------------------------------------------

    async def resolve(self, repository: str, reference: str) -> Resolved | None:
        try:
            manifest = await self.get_manifest(repository, reference)
        except RegistryNotFound:
            return None
        return Resolved(manifest.digest, manifest.media_type,
                        manifest_annotations(manifest.body))

    async def list_tags(self, repository: str) -> list[str]:
        """Every tag of ``repository``'s layout, sorted (none if it has no layout)."""
        where = self.layout_dir(repository)

        def tags() -> list[str]:
            return sorted({_tag_of(e) for e in _load_index(where)["manifests"]
                           if isinstance(e, dict) and _tag_of(e)})
        return await self._run(tags, f"list the tags of {repository}")

    async def get_manifest(self, repository: str, reference: str) -> Manifest:
        where = self.layout_dir(repository)
        return await self._run(lambda: _read_manifest(where, repository, reference),
                               f"read {repository}:{reference}")

    async def get_blob(self, repository: str, digest: str, dest: Path) -> int:
        where = self.layout_dir(repository)
        if not is_digest(digest):
            raise RegistryBadRequest(f"{digest!r} is not a sha256 digest")

        def copy() -> int:
            blob = _blob_path(where, digest)
            if not blob.exists():
                raise RegistryNotFound(f"{repository}@{digest}: no such blob", status=404,
                                       code="BLOB_UNKNOWN")
            with blob.open("rb") as src:
                size = _atomic_write(dest, lambda out: _copy_hashing(src, out, digest))
            return size

        return await self._run(copy, f"read blob {repository}@{digest}")

    async def push_blob(self, repository: str, source: Path | bytes, *,
                        media_type: str = "application/octet-stream",
                        digest: str | None = None) -> Descriptor:
        where = self.layout_dir(repository)
        known = digest

        def store() -> Descriptor:
            _init_layout(where)
            if isinstance(source, bytes):
                digest = "sha256:" + hashlib.sha256(source).hexdigest()
                size = len(source)
            elif known is not None:  # checked as it is copied (_copy_hashing)
                if not is_digest(known):
                    raise RegistryBadRequest(f"{known!r} is not a sha256 digest")
                digest, size = known, source.stat().st_size
            else:
                digest, size = _hash_file(source)
            blob = _blob_path(where, digest)
            if blob.exists() and blob.stat().st_size == size:
                os.utime(blob)  # fresh again: a GC running now must spare it (gc_grace)
                return Descriptor(media_type, digest, size)
            if isinstance(source, bytes):
                _atomic_write(blob, lambda out: out.write(source))
            else:
                with source.open("rb") as src:
                    _atomic_write(blob, lambda out: _copy_hashing(src, out, digest))
            return Descriptor(media_type, digest, size)

        return await self._run(store, f"write blob to {repository}")

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        where = self.layout_dir(repository)
        if tag is not None and not is_valid_tag(tag):
            raise RegistryBadRequest(f"{tag!r} is not a valid tag")
        parse_manifest(body)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()

        def store() -> str:
            _init_layout(where)
            blob = _blob_path(where, digest)
            if not blob.exists():
                _atomic_write(blob, lambda out: out.write(body))
            os.utime(blob)
            with _locked(where):
                index = _load_index(where)
                entries = [e for e in index["manifests"] if isinstance(e, dict)]
                for old in entries:
                    if tag is not None and _tag_of(old) == tag:
                        old.get("annotations", {}).pop(REF_NAME, None)
                # One untagged entry per digest at most; a tagged entry makes it redundant.
                entries = [e for e in entries if not (e.get("digest") == digest and
                                                      not _tag_of(e))]
                new: dict[str, Any] = {"mediaType": media_type, "digest": digest,
                                       "size": len(body)}
                if tag is not None:
                    new["annotations"] = {REF_NAME: tag}
                if tag is not None or not any(e.get("digest") == digest for e in entries):
                    entries.append(new)
                index["manifests"] = [_clean(e) for e in entries]
                _write_index(where, index)
            return digest

        return await self._run(store, f"write manifest to {repository}")

    async def delete_manifest(self, repository: str, digest: str) -> None:
        if not is_digest(digest):
            raise RegistryBadRequest(f"delete {repository}: {digest!r} is not a sha256 digest")
        if not self.allow_delete:
            raise RegistryUnsupported(f"DELETE {repository}@{digest}: 405 UNSUPPORTED: this "
                                      "layout does not allow deletes", status=405,
                                      code="UNSUPPORTED")
        where = self.layout_dir(repository)

        def delete() -> None:
            if not (where / "index.json").exists():
                raise RegistryNotFound(f"{repository}@{digest}: no such manifest", status=404,
                                       code="MANIFEST_UNKNOWN")
            with _locked(where):
                index = _load_index(where)
                kept = [e for e in index["manifests"]
                        if not (isinstance(e, dict) and e.get("digest") == digest)]
                if len(kept) == len(index["manifests"]):
                    raise RegistryNotFound(f"{repository}@{digest}: no such manifest",
                                           status=404, code="MANIFEST_UNKNOWN")
                index["manifests"] = kept
                _write_index(where, index)
                _collect_garbage(where, kept, grace=self.gc_grace)

        await self._run(delete, f"delete {repository}@{digest}")

    async def _run(self, work: Callable[[], T], what: str) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.to_thread(work)
        except RegistryError:
            raise
        except TimeoutError as exc:
            raise RegistryTimeout(f"{what}: the disk did not answer within "
                                  f"{self.timeout}s") from exc
        except PermissionError as exc:
            raise RegistryForbidden(f"{what}: {exc}", status=403) from exc
        except OSError as exc:
            raise RegistryUnreachable(f"{what}: {exc}") from exc


# --- disk work (runs in a thread) ---------------------------------------------------------

def _blob_path(where: Path, digest: str) -> Path:
    return where / "blobs" / "sha256" / digest.split(":", 1)[1]


def _tag_of(entry: dict[str, Any]) -> str:
    annotations = entry.get("annotations")
    return str(annotations.get(REF_NAME, "")) if isinstance(annotations, dict) else ""


def _clean(entry: dict[str, Any]) -> dict[str, Any]:
    if isinstance(entry.get("annotations"), dict) and not entry["annotations"]:
        entry = {k: v for k, v in entry.items() if k != "annotations"}
    return entry


def _init_layout(where: Path) -> None:
    (where / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (where / "oci-layout").exists():
        _atomic_write(where / "oci-layout", lambda out: out.write(json.dumps(
            LAYOUT_VERSION).encode()))


def _load_index(where: Path) -> dict[str, Any]:
    path = where / "index.json"
    if not path.exists():
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    try:
        index = json.loads(path.read_bytes())
    except ValueError as exc:
        raise RegistryBadResponse(f"{path} is not JSON: {exc}") from exc
    if not isinstance(index, dict) or not isinstance(index.get("manifests", []), list):
        raise RegistryBadResponse(f"{path} is not an OCI index")
    index.setdefault("manifests", [])
    return index


def _write_index(where: Path, index: dict[str, Any]) -> None:
    body = json.dumps(index, indent=2, sort_keys=True).encode() + b"\n"
    _atomic_write(where / "index.json", lambda out: out.write(body))


def _read_manifest(where: Path, repository: str, reference: str) -> Manifest:
    if not is_digest(reference) and not is_valid_tag(reference):
        raise RegistryBadRequest(f"{reference!r} is neither a tag nor a sha256 digest")
    missing = RegistryNotFound(f"{repository}:{reference}: manifest unknown", status=404,
                               code="MANIFEST_UNKNOWN")
    if not (where / "index.json").exists():
        raise missing
    found = None
    for entry in _load_index(where)["manifests"]:
        if not isinstance(entry, dict):
            continue
        if (entry.get("digest") == reference) or (_tag_of(entry) == reference):
            found = entry
    if found is None:
        raise missing
    digest = str(found.get("digest"))
    try:
        body = _blob_path(where, digest).read_bytes()
    except FileNotFoundError as exc:
        raise RegistryBadResponse(f"{repository}: index.json lists {digest} but its blob is "
                                  "missing (a corrupt layout)") from exc
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise RegistryBadResponse(f"{repository}: blob {digest} does not match its digest")
    media_type = str(found.get("mediaType") or parse_manifest(body).get("mediaType")
                     or OCI_MANIFEST)
    return Manifest(digest, media_type, body)


def _hash_file(path: Path) -> tuple[str, int]:
    hasher = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(1024 * 1024):
            hasher.update(block)
            size += len(block)
    return "sha256:" + hasher.hexdigest(), size


def _copy_hashing(src: Any, out: Any, digest: str) -> int:
    hasher = hashlib.sha256()
    size = 0
    while block := src.read(1024 * 1024):
        hasher.update(block)
        size += len(block)
        out.write(block)
    if "sha256:" + hasher.hexdigest() != digest:
        raise RegistryBadResponse(f"content does not match {digest}")
    return size


def _atomic_write(path: Path, fill: Callable[[Any], Any]) -> int:
    """Write ``path`` via a fsynced temporary file and a rename; ``fill``'s result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            result = fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return int(result) if isinstance(result, int) else 0


@contextlib.contextmanager
def _locked(where: Path) -> Iterator[None]:
    with (where / ".lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _collect_garbage(where: Path, entries: list[Any], *, grace: float) -> None:
    """Remove blobs no listed manifest references (transitively), older than ``grace``."""
    live: set[str] = set()
    pending = [str(e.get("digest")) for e in entries if isinstance(e, dict)]
    while pending:
        digest = pending.pop()
        if digest in live:
            continue
        live.add(digest)
        path = _blob_path(where, digest)
        with contextlib.suppress(OSError, RegistryBadResponse):
            if path.stat().st_size <= 4 * 1024 * 1024:
                pending.extend(referenced_digests(path.read_bytes()) - live)
    cutoff = time.time() - grace
    blobs = where / "blobs" / "sha256"
    for blob in blobs.iterdir() if blobs.exists() else ():
        if blob.name.startswith(".") or f"sha256:{blob.name}" in live:
            continue
        with contextlib.suppress(OSError):
            if blob.stat().st_mtime < cutoff:
                blob.unlink()
