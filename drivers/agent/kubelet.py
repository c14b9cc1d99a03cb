"""The ``kubelet`` dumper: the Kubernetes ContainerCheckpoint API, one container at a time.

``POST https://<kubelet>:10250/checkpoint/{namespace}/{pod}/{container}?timeout=<s>``
asks the kubelet (feature ``ContainerCheckpoint``, GA in 1.30; CRI-O or containerd with
CRIU underneath) to checkpoint a running container. It answers
``{"items": ["/var/lib/kubelet/checkpoints/checkpoint-<pod>_<ns>-<container>-<time>.tar"]}``:
the archive is written on the node. The agent sees that directory mounted at
``KubeletSettings.checkpoint_dir`` (``kubelet_checkpoint_dir`` is how the kubelet names
it), moves the archive into the capture's work directory (so the node's checkpoint
directory does not fill up) and hands it over for the push.

The checkpoint leaves the container running (CRIU ``--leave-running``), so
:meth:`KubeletDumper.release` has nothing to do. Restoring is the runtime's job (CRI-O
creates a container from the checkpoint image when a pod names it as its image), so
:meth:`KubeletDumper.restore` reports ``RestoreUnsupported``.

Auth: a bearer token (a service account allowed ``nodes/checkpoint``) and/or a client
certificate; the kubelet's serving certificate is checked against ``ca_file`` (the
system's CAs when empty) unless ``insecure``. Every call is bounded by ``timeout`` (also
passed to the kubelet). Errors: 401/403 (not allowed), 404 (no such container, or the
feature is off), 500 (the runtime failed: its message is kept), an untrusted serving
certificate and unusable TLS files become :class:`~drivers.agent.errors.DumpFailed`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import aiohttp

from drivers.agent.dumper import (
    DumpRequest,
    DumpResult,
    RestoreRequest,
    RestoreResult,
    Workload,
)
from drivers.agent.errors import DumpFailed, RestoreUnsupported
from drivers.registry.checkpoints import Archive

FORMAT = "kubelet-checkpoint/v1"
KUBELET_DIR = "/var/lib/kubelet/checkpoints"


@dataclass(frozen=True)
class KubeletSettings:
    url: str = "https://127.0.0.1:10250"
    token: str = field(default="", repr=False)
    ca_file: str = ""
    client_cert: str = ""
    client_key: str = ""
    insecure: bool = False
    checkpoint_dir: Path = Path(KUBELET_DIR)  # the node's checkpoint directory, as mounted
    kubelet_checkpoint_dir: str = KUBELET_DIR  # ... as the kubelet names it
    timeout: float = 300.0


class KubeletDumper:
    """Captures containers through the kubelet's checkpoint endpoint."""

    name = "kubelet"

    def __init__(self, settings: KubeletSettings | None = None) -> None:
        self.settings = settings or KubeletSettings()

    async def dump(self, request: DumpRequest) -> DumpResult:
        archives = []
        for container in request.containers:
            reported = await self._checkpoint(request.workload, container.name)
            local = self._local_path(reported)
            target = request.workdir / f"{container.name}.tar"
            try:
                await asyncio.to_thread(shutil.move, local, target)
            except OSError as exc:
                raise DumpFailed(f"the kubelet wrote {reported}, but the agent cannot take "
                                 f"it from {local}: {exc} (is the checkpoint directory "
                                 "mounted?)") from exc
            archives.append(Archive(container.name, target, container.image))
        return DumpResult(tuple(archives), FORMAT)

    async def release(self, workload: Workload) -> None:
        return None  # the kubelet's checkpoint never stops the container

    async def restore(self, request: RestoreRequest) -> RestoreResult:
        raise RestoreUnsupported("the kubelet dumper cannot restore: the container runtime "
                                 "restores a checkpoint image named as the pod's image")

    async def _checkpoint(self, w: Workload, container: str) -> str:
        s = self.settings
        url = (f"{s.url.rstrip('/')}/checkpoint/{quote(w.namespace, safe='')}/"
               f"{quote(w.name, safe='')}/{quote(container, safe='')}")
        headers = {"Authorization": f"Bearer {s.token}"} if s.token else {}
        what = f"kubelet checkpoint of {w.key}/{container}"
        tls = self._ssl()
        try:
            async with asyncio.timeout(s.timeout + 5), aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=s.timeout + 5)) as session, \
                    session.post(url, params={"timeout": str(int(s.timeout))},
                                 headers=headers, ssl=tls) as response:
                body = await response.text()
                status = response.status
        except TimeoutError as exc:
            raise DumpFailed(f"{what}: no answer within {s.timeout:g}s") from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            trusted = f"the CA file {s.ca_file}" if s.ca_file else "the system's CAs"
            raise DumpFailed(f"{what}: the kubelet's serving certificate is not trusted "
                             f"(verified against {trusted}; set the kubelet CA): "
                             f"{exc.certificate_error}") from exc
        except aiohttp.ClientError as exc:
            raise DumpFailed(f"{what}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            hint = {401: " (the agent's token is not accepted)",
                    403: " (the agent may not use nodes/checkpoint)",
                    404: " (no such container, or the ContainerCheckpoint feature is off)",
                    }.get(status, "")
            raise DumpFailed(f"{what}: HTTP {status}{hint}: {body.strip()[:500]}")
        try:
            items = json.loads(body).get("items")
        except (ValueError, AttributeError) as exc:
            raise DumpFailed(f"{what}: the answer is not JSON: {body[:200]!r}") from exc
        if not isinstance(items, list) or not items or not isinstance(items[0], str):
            raise DumpFailed(f"{what}: the answer names no archive: {body[:200]!r}")
        return items[0]

    def _local_path(self, reported: str) -> Path:
        s = self.settings
        path = PurePosixPath(reported)
        base = PurePosixPath(s.kubelet_checkpoint_dir)
        if not path.is_relative_to(base) or ".." in path.parts:
            raise DumpFailed(f"the kubelet wrote {reported}, outside its checkpoint "
                             f"directory {base}")
        return s.checkpoint_dir / path.relative_to(base)

    def _ssl(self) -> ssl.SSLContext | bool:
        s = self.settings
        if not s.url.startswith("https://"):
            return False
        # A missing or malformed file is a configuration error: say which file, rather
        # than let a bare FileNotFoundError/SSLError become the capture's reason.
        try:
            context = ssl.create_default_context(cafile=s.ca_file or None)
        except OSError as exc:  # ssl.SSLError is an OSError
            raise DumpFailed(f"cannot use the kubelet CA file {s.ca_file!r}: {exc}") from exc
        if s.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if s.client_cert:
            try:
                context.load_cert_chain(s.client_cert, s.client_key or None)
            except OSError as exc:
                raise DumpFailed(f"cannot use the kubelet client certificate "
                                 f"{s.client_cert!r}: {exc}") from exc
        return context


def token_from_file(path: str | os.PathLike[str]) -> str:
    """A service account token, as mounted in the agent's pod."""
    return Path(path).read_text().strip()
