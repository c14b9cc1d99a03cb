"""The OCI Distribution API v2 client: the :class:`~drivers.registry.port.Registry` over HTTP.

=========================  ==============================================================
operation                  requests
=========================  ==============================================================
``resolve``                ``HEAD /v2/<name>/manifests/<ref>`` -> digest; the manifest's
                           annotations come from a cache by digest (manifests are
                           immutable) or one ``GET`` by digest. 404 -> ``None``.
``get_manifest``           ``GET /v2/<name>/manifests/<ref>``; sha256 of the body checked
                           against the digest asked for / ``Docker-Content-Digest``
``get_blob``               ``GET /v2/<name>/blobs/<digest>`` streamed to a temp file,
                           hashed on the way, renamed into place when it matches
``push_blob``              ``HEAD`` (skip if present), ``POST .../blobs/uploads/``, then
                           one ``PUT ?digest=`` (monolithic, up to ``chunk_size``) or
                           ``PATCH`` chunks with ``Content-Range`` and a final ``PUT``
``push_manifest``          ``PUT /v2/<name>/manifests/<tag|digest>``
``delete_manifest``        ``DELETE /v2/<name>/manifests/<digest>`` (405: deletes are
                           disabled on that registry -> ``RegistryUnsupported``)
=========================  ==============================================================

Auth, timeouts, retries and typed errors are the :class:`~drivers.registry.transport.
Transport`'s. An upload is retried as a whole (a chunk cannot be resent blindly).
Used by the registry observer, the ``DeleteManifest`` handler and the node agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import aiohttp

from drivers.registry.auth import request_scope
from drivers.registry.errors import (
    RegistryBadRequest,
    RegistryBadResponse,
    RegistryError,
    RegistryNotFound,
    RegistryUnreachable,
)
from drivers.registry.manifests import manifest_annotations
from drivers.registry.port import (
    MANIFEST_TYPES,
    Descriptor,
    Manifest,
    Resolved,
    sha256_digest,
)
from drivers.registry.transport import RegistrySettings, Sleep, Transport

ACCEPT = ", ".join(MANIFEST_TYPES)
READ_SIZE = 1024 * 1024
#: Tags asked for per page of a tag list (registries cap ``n``; the Link header says more).
TAGS_PAGE = 100


def split_repository(repository: str) -> tuple[str, str]:
    """``host[:port]/path`` -> (host, path); the path is the repository name on the host."""
    host, sep, name = repository.partition("/")
    if not sep or not name or not ("." in host or ":" in host or host == "localhost"):
        raise RegistryBadRequest(f"{repository!r} is not a repository like "
                                 "'registry.example.com/team/app'")
    return host, name


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def is_digest(reference: str) -> bool:
    """A sha256 digest, strictly: 64 lowercase hex digits (a digest read from a manifest
    becomes a path in a layout and a URL here, so nothing else may pass)."""
    return _DIGEST.fullmatch(reference) is not None


class RegistryClient:
    """A registry (or several) spoken to over the Distribution API."""

    def __init__(self, settings: RegistrySettings | None = None, *,
                 transport: Transport | None = None, sleep: Sleep = asyncio.sleep) -> None:
        self.transport = transport or Transport(settings, sleep=sleep)
        self.settings = self.transport.settings
        self._resolved: OrderedDict[str, Resolved] = OrderedDict()
        self._uploading: dict[str, tuple[asyncio.Lock, int]] = {}

    async def close(self) -> None:
        await self.transport.close()

    # --- reading -------------------------------------------------------------------------

    async def resolve(self, repository: str, reference: str) -> Resolved | None:
        host, name = split_repository(repository)
        try:
            reply = await self.transport.send(
                "HEAD", host, f"/v2/{name}/manifests/{reference}",
                scope=request_scope(name, push=False), headers={"Accept": ACCEPT})
        except RegistryNotFound:
            return None
        digest = reply.headers.get("Docker-Content-Digest", "")
        if is_digest(reference):
            if digest and digest != reference:
                raise RegistryBadResponse(f"{repository}@{reference}: the registry says it "
                                          f"is {digest}")
            digest = reference
        key = f"{repository}@{digest}"
        if digest and key in self._resolved:
            self._resolved.move_to_end(key)
            return self._resolved[key]
        try:
            manifest = await self.get_manifest(repository, digest or reference)
        except RegistryNotFound:
            return None  # deleted between the HEAD and the GET
        resolved = Resolved(manifest.digest, manifest.media_type,
                            manifest_annotations(manifest.body))
        self._remember(f"{repository}@{manifest.digest}", resolved)
        return resolved

    async def list_tags(self, repository: str) -> list[str]:
        """Every tag of ``repository``, sorted (``GET /v2/<name>/tags/list``, page by page
        with ``n``/``last``); none for a repository the registry does not know."""
        host, name = split_repository(repository)
        tags: list[str] = []
        params = {"n": str(TAGS_PAGE)}
        while True:
            try:
                reply = await self.transport.send(
                    "GET", host, f"/v2/{name}/tags/list", scope=request_scope(name, push=False),
                    params=params)
            except RegistryNotFound:
                return tags
            try:
                page = json.loads(reply.body).get("tags") or []
            except (ValueError, AttributeError) as exc:
                raise RegistryBadResponse(f"{repository}: the tag list is not JSON: {exc}") \
                    from None
            if not isinstance(page, list):
                raise RegistryBadResponse(f"{repository}: the tag list is not a list")
            tags.extend(str(tag) for tag in page)
            if not page or 'rel="next"' not in reply.headers.get("Link", ""):
                return sorted(set(tags))
            params = {"n": str(TAGS_PAGE), "last": str(page[-1])}

    async def get_manifest(self, repository: str, reference: str) -> Manifest:
        host, name = split_repository(repository)
        reply = await self.transport.send(
            "GET", host, f"/v2/{name}/manifests/{reference}",
            scope=request_scope(name, push=False), headers={"Accept": ACCEPT})
        digest = sha256_digest(reply.body)
        claimed = reference if is_digest(reference) else \
            reply.headers.get("Docker-Content-Digest", digest)
        if claimed != digest:
            raise RegistryBadResponse(f"{repository}:{reference}: the manifest's sha256 is "
                                      f"{digest}, not {claimed}")
        media_type = reply.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return Manifest(digest, media_type, reply.body)

    async def get_blob(self, repository: str, digest: str, dest: Path) -> int:
        host, name = split_repository(repository)
        partial = dest.with_name(f".{dest.name}.partial")
        hasher = hashlib.sha256()
        size = 0

        async def sink(response: aiohttp.ClientResponse) -> None:
            nonlocal size
            with partial.open("wb") as out:
                async for chunk in response.content.iter_chunked(READ_SIZE):
                    hasher.update(chunk)
                    size += len(chunk)
                    out.write(chunk)

        try:
            await self.transport.send("GET", host, f"/v2/{name}/blobs/{digest}",
                                      scope=request_scope(name, push=False), sink=sink,
                                      timeout_seconds=self.settings.blob_timeout)
            got = "sha256:" + hasher.hexdigest()
            if got != digest:
                raise RegistryBadResponse(f"{repository}@{digest}: the blob's sha256 is {got}")
            os.replace(partial, dest)
        except OSError as exc:
            raise RegistryUnreachable(f"cannot write blob {digest} to {dest}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                partial.unlink()
        return size

    # --- writing -------------------------------------------------------------------------

    async def push_blob(self, repository: str, source: Path | bytes, *,
                        media_type: str = "application/octet-stream",
                        digest: str | None = None) -> Descriptor:
        if digest is not None and isinstance(source, Path):  # the registry checks it
            size = (await asyncio.to_thread(source.stat)).st_size
        else:
            digest, size = await _digest_of(source)
        descriptor = Descriptor(media_type, digest, size)
        # Concurrent uploads of one blob to one repository race inside distribution
        # (one of them can fail DIGEST_INVALID): within this client, one upload at a time
        # per blob, and the followers find it present.
        key = f"{repository}@{digest}"
        lock, users = self._uploading.get(key, (asyncio.Lock(), 0))
        self._uploading[key] = (lock, users + 1)
        try:
            async with lock:
                await self._push_blob(repository, source, descriptor)
        finally:
            lock, users = self._uploading[key]
            if users == 1:
                del self._uploading[key]
            else:
                self._uploading[key] = (lock, users - 1)
        return descriptor

    async def _push_blob(self, repository: str, source: Path | bytes,
                         descriptor: Descriptor) -> None:
        host, name = split_repository(repository)
        digest, size = descriptor.digest, descriptor.size
        scope = request_scope(name, push=True)
        try:
            await self.transport.send("HEAD", host, f"/v2/{name}/blobs/{digest}",
                                      scope=request_scope(name, push=False))
            return
        except RegistryNotFound:
            pass
        attempts = max(1, self.settings.attempts)
        for attempt in range(1, attempts + 1):
            try:
                await self._upload(host, name, scope, source, digest, size)
                return
            except RegistryError as exc:
                if not exc.retryable or attempt == attempts:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _upload(self, host: str, name: str, scope: str, source: Path | bytes,
                      digest: str, size: int) -> None:
        started = await self.transport.send("POST", host, f"/v2/{name}/blobs/uploads/",
                                            scope=scope, ok=(202,), repeatable=False,
                                            headers={"Content-Length": "0"})
        location = _location(started.headers)
        octets = {"Content-Type": "application/octet-stream"}
        if size <= self.settings.chunk_size:
            data = source if isinstance(source, bytes) else await asyncio.to_thread(
                source.read_bytes)
            await self.transport.send("PUT", host, _with_digest(location, digest), scope=scope,
                                      headers=octets, body=data, ok=(201,), repeatable=False,
                                      timeout_seconds=self.settings.blob_timeout)
            return
        offset = 0
        while offset < size:
            chunk = await _read_chunk(source, offset, self.settings.chunk_size)
            end = offset + len(chunk) - 1
            reply = await self.transport.send(
                "PATCH", host, location, scope=scope, body=chunk, ok=(202,), repeatable=False,
                headers={**octets, "Content-Range": f"{offset}-{end}"},
                timeout_seconds=self.settings.blob_timeout)
            location = _location(reply.headers)
            offset = end + 1
        await self.transport.send("PUT", host, _with_digest(location, digest), scope=scope,
                                  headers={"Content-Length": "0"}, ok=(201,),
                                  repeatable=False)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        host, name = split_repository(repository)
        digest = sha256_digest(body)
        reply = await self.transport.send(
            "PUT", host, f"/v2/{name}/manifests/{tag or digest}",
            scope=request_scope(name, push=True), headers={"Content-Type": media_type},
            body=body, ok=(201,))
        claimed = reply.headers.get("Docker-Content-Digest", digest)
        if claimed != digest:
            raise RegistryBadResponse(f"{repository}: the registry stored the manifest as "
                                      f"{claimed}, but its sha256 is {digest}")
        return digest

    async def delete_manifest(self, repository: str, digest: str) -> None:
        host, name = split_repository(repository)
        if not is_digest(digest):
            raise RegistryBadRequest(f"delete {repository}: {digest!r} is not a sha256 digest")
        await self.transport.send("DELETE", host, f"/v2/{name}/manifests/{digest}",
                                  scope=request_scope(name, push=False, delete=True),
                                  ok=(200, 202, 204))
        self._resolved.pop(f"{repository}@{digest}", None)

    def _remember(self, key: str, resolved: Resolved) -> None:
        self._resolved[key] = resolved
        self._resolved.move_to_end(key)
        while len(self._resolved) > self.settings.manifest_cache:
            self._resolved.popitem(last=False)


def _location(headers: Mapping[str, str]) -> str:
    location = headers.get("Location", "")
    if not location:
        raise RegistryBadResponse("the registry started an upload without a Location")
    return str(location)


def _with_digest(location: str, digest: str) -> str:
    return location + ("&" if "?" in location else "?") + "digest=" + quote(digest, safe="")


async def _digest_of(source: Path | bytes) -> tuple[str, int]:
    if isinstance(source, bytes):
        return sha256_digest(source), len(source)

    def walk() -> tuple[str, int]:
        hasher = hashlib.sha256()
        size = 0
        with source.open("rb") as f:
            while block := f.read(READ_SIZE):
                hasher.update(block)
                size += len(block)
        return "sha256:" + hasher.hexdigest(), size

    try:
        return await asyncio.to_thread(walk)
    except OSError as exc:
        raise RegistryUnreachable(f"cannot read {source}: {exc}") from exc


async def _read_chunk(source: Path | bytes, offset: int, size: int) -> bytes:
    if isinstance(source, bytes):
        return source[offset:offset + size]

    def read() -> bytes:
        with source.open("rb") as f:
            f.seek(offset)
            return f.read(size)

    return await asyncio.to_thread(read)
