"""A registry of one's own on loopback: Debian's ``docker-registry`` on a free port.

Real container runtimes pull images over HTTP, so the real-checkpoint demo (``cpctl demo
--runtime criu``) cannot use the on-disk OCI layout: :func:`local_registry` starts
``docker-registry serve`` (CNCF distribution v2) with a config and storage under
``workdir``, deletes enabled, listening on ``127.0.0.1:0``, and yields its
``host:port`` once it listens; it stops the server when the block ends. A missing binary
is a :class:`~drivers.registry.errors.RegistryError` that says how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

from controlplane.errors import ControlPlaneError

BINARY = Path("/usr/bin/docker-registry")
_LISTENING = re.compile(r"listening on (127\.0\.0\.1:\d+)")


class LocalRegistryFailed(ControlPlaneError):
    """``docker-registry`` is missing or did not start."""


def _config(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"version": 0.1, "log": {"level": "info", "accesslog": {"disabled": True}},
              "storage": {"filesystem": {"rootdirectory": str(workdir / "storage")},
                          "delete": {"enabled": True}},
              "http": {"addr": "127.0.0.1:0", "secret": "controlplane-local"}}
    path = workdir / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@contextlib.asynccontextmanager
async def local_registry(workdir: Path, *, binary: Path = BINARY) -> AsyncIterator[str]:
    if not await asyncio.to_thread(binary.exists):
        raise LocalRegistryFailed(f"{binary} is missing",
                                  hint="scripts/ensure-registry installs Debian's "
                                       "docker-registry package")
    config = await asyncio.to_thread(_config, workdir)
    proc = await asyncio.create_subprocess_exec(
        str(binary), "serve", str(config), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    seen: list[str] = []
    drain: asyncio.Task[None] | None = None
    try:
        host = ""
        async with asyncio.timeout(20):
            while not host:
                line = (await proc.stdout.readline()).decode(errors="replace")
                if not line:
                    raise LocalRegistryFailed("docker-registry exited: " + "".join(seen[-5:]))
                seen.append(line)
                found = _LISTENING.search(line)
                host = found.group(1) if found else ""
        drain = asyncio.get_running_loop().create_task(_drain(proc.stdout))
        yield host
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
