"""The two backends of the registry port, opened for a test: the OCI layout and a real registry.

Used by the registry contract suite (through ``tests/registry/conftest.py``) and by the
agent tests' world.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from drivers.registry import OciLayout, RegistryClient, RegistrySettings
from drivers.registry.port import Registry
from tests.registry.servers import run_registry

# Small chunks, so that a 256 KiB blob exercises the chunked upload path.
FAST = RegistrySettings(backoff_initial=0.01, backoff_max=0.05, request_timeout=10,
                        chunk_size=64 * 1024)


@dataclass
class Backend:
    kind: str
    registry: Registry
    host: str  # the registry part of references

    def repo(self, name: str = "checkpoints/app") -> str:
        return f"{self.host}/{name}"


async def open_backend(kind: str, tmp_path: Path, *, delete: bool) -> AsyncIterator[Backend]:
    """``layout`` (gc_grace 0) or ``distribution`` (docker-registry on loopback)."""
    if kind == "layout":
        yield Backend(kind, OciLayout(tmp_path / "oci", allow_delete=delete, gc_grace=0),
                      "localhost:5000")
        return
    async with run_registry(tmp_path / "registry", delete=delete) as server:
        client = RegistryClient(FAST)
        try:
            yield Backend(kind, client, server.host)
        finally:
            await client.close()
