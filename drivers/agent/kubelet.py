"""The ``kubelet`` dumper: the Kubernetes ContainerCheckpoint API, one container at a time.

``POST https://<kubelet>:10250/checkpoint/{namespace}/{pod}/{container}?timeout=<s>``
asks the kubelet (feature ``ContainerCheckpoint``, GA in 1.30; CRI-O or containerd with
CRIU underneath) to checkpoint a running container. It answers
``{"items": ["/var/lib/kubelet/checkpoints/checkpoint-<pod>_<ns>-<container>-<time>.tar"]}``:
the archive is written on the node. The agent sees that directory mounted at
``KubeletSettings.checkpoint_dir`` (``kubelet_checkpoint_dir`` is how the kubelet names
it), moves the archive into the capture's work directory (so the node's checkpoint
directory does not fill up) and hands it over for the push.

The checkpoint leaves the container running (CRIU ``--leave-running``; CRI-O pauses it
for the dump and unpauses it after, undoing any freeze made beforehand; a container
stopped by ``SIGSTOP`` beforehand, or frozen through its pod's cgroup, makes the dump hang
or fail: measured on CRI-O 1.36.3). So a *quiesced* capture watches the dump from a
thread and sends ``SIGSTOP`` in the window after CRIU detaches and before CRI-O thaws
the container (:func:`~drivers.agent.stopper.stop_when_dumped`): the signal waits in the
frozen tasks, so the source does not run past its checkpoint. If the window is missed
(``quiesced`` records ``late``), the signal follows the kubelet's answer and the source
may have run on for a moment. :meth:`KubeletDumper.release` sends ``SIGCONT`` (a failed
or withdrawn capture, a wake in place; harmless to a container that runs).

Restoring is the runtime's job (``runtime_restores``): the control plane creates the pod
with each container's image set to its checkpoint image, and CRI-O restores it.
:meth:`KubeletDumper.restore` watches the pod until every checkpointed container runs
from its checkpoint image, then sends ``SIGCONT`` (CRIU restores stopped tasks stopped);
a container the runtime could not create (``CreateContainerError``, a pull error) fails
the restore with the runtime's own message. With ``cri_endpoint`` set, it first pulls
each container's base image through ``crictl`` (CRI-O restores onto it and does not pull
it itself). The kubelet may ask CRI-O before that pull has ended (the pod names its
checkpoint images from birth), and CRI-O then answers ``locating image with ID <id>:
image not known``: once the node holds that image, the restore waits for the kubelet's
retry (after its back-off, ~10 s) for up to ``RETRY_SECONDS``, rather than fail the attempt.

A **sealed** checkpoint (ocicrypt layers, docs/security.md) is pulled by the agent first:
CRI-O decrypts with the keys in its ``decryption_keys_path``, but containers/image will not
decrypt into a destination named by digest — the form the restore pod names
(containers/image#1768). So the agent pulls each checkpoint image by its ``cpimage-``
tag, then proves the node now holds the pinned digest (``crictl inspecti
repo@sha256:...``) — a tag moved to another image fails here, before anything runs. A
node without the key fails that pull with ocicrypt's own words. Meanwhile the kubelet's
own digest pull fails once (``ErrImagePull``, "Destination specifies a digest") and is
retried after its back-off, when the image is there: the restore waits that out.

Lazy (post-copy) migrations: :mod:`drivers.agent.kubelet_lazy` (``start_lazy``,
``restore_lazy``, ``refuse_mode``), on nodes whose CRI-O runs runc through
:mod:`drivers.realnode.runc_wrapper`, given the node's CRI-O storage and runc roots.

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
import re
import shutil
import signal
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import aiohttp

from controlplane.logs import get_logger
from drivers.agent import kubelet_lazy
from drivers.agent.dumper import (
    Container,
    DumpRequest,
    DumpResult,
    RestoreRequest,
    RestoreResult,
    Workload,
)
from drivers.agent.errors import DumpFailed, RestoreFailed, RestoreUnsupported
from drivers.agent.pods import PodPatcher
from drivers.agent.stopper import signal_container, stop_when_dumped
from drivers.registry.checkpoint_images import image_tag
from drivers.registry.checkpoints import Archive

log = get_logger("drivers.agent.kubelet")
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
    cgroup_root: Path = Path("/sys/fs/cgroup")  # the node's cgroups, as mounted
    cri_endpoint: str = ""  # unix:///var/run/crio/crio.sock: pre-pull base images
    crictl: str = "crictl"
    # Lazy migrations (drivers.agent.kubelet_lazy): the node's CRI-O storage root and
    # runc root as mounted (CRI-O's root and runtime_root), and CRIU for the target's
    # lazy-pages daemon; without the two roots, lazy is refused.
    crio_root: Path | None = None
    runc_root: Path | None = None
    criu: str = "criu"


#: Waiting reasons of a container the runtime could not create or pull: the restore
#: failed (the kubelet would retry it with a back-off, never with another outcome).
FAILED_WAITING = frozenset({"CreateContainerError", "CreateContainerConfigError",
                            "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                            "CrashLoopBackOff", "RunContainerError"})
#: What CRI-O answers when it restores onto a base image the node does not hold (yet);
#: 1.36.3: ``reading image "<id>": locating image with ID "<id>": image not known``.
IMAGE_NOT_KNOWN = re.compile(r'locating image with ID "?([0-9a-f]{12,64})"?: image not known')
#: Seconds a restore waits for the kubelet to ask CRI-O again once the base image it
#: lacked is on the node (the kubelet retries a failed create after ~10 s).
RETRY_SECONDS = 60.0


class KubeletDumper:
    """Captures containers through the kubelet's checkpoint endpoint."""

    name = "kubelet"
    runtime_restores = True

    def __init__(self, settings: KubeletSettings | None = None, *,
                 patcher: PodPatcher | None = None) -> None:
        self.settings = settings or KubeletSettings()
        #: The agent's pod patches (a lazy restore names the pushed hand-over by digest).
        self.patcher = patcher
        #: container id -> how its quiesce went ("held": stopped before CRI-O thawed it;
        #: "late"/"no-freezer": after, so it may have run on for a moment)
        self.quiesced: dict[str, str] = {}

    async def dump(self, request: DumpRequest) -> DumpResult:
        archives = []
        for container in request.containers:
            reported = await self._checkpoint_quiesced(request, container)
            local = self._local_path(reported)
            target = request.workdir / f"{container.name}.tar"
            try:
                await asyncio.to_thread(shutil.move, local, target)
            except OSError as exc:
                raise DumpFailed(f"the kubelet wrote {reported}, but the agent cannot take "
                                 f"it from {local}: {exc} (is the checkpoint directory "
                                 "mounted?)") from exc
            archives.append(Archive(container.name, target, base_image(container)))
        return DumpResult(tuple(archives), FORMAT)

    async def _checkpoint_quiesced(self, request: DumpRequest, container: Container) -> str:
        """The kubelet's checkpoint; when quiesced, the container stopped right after the
        dump, before CRI-O thaws it (:func:`~drivers.agent.stopper.stop_when_dumped`)."""
        if not request.quiesce:
            return await self._checkpoint(request.workload, container.name)
        if not container.id:
            raise DumpFailed(f"cannot quiesce container {container.name}: the pod status "
                             "names no container id yet")
        done = threading.Event()
        watcher = asyncio.create_task(asyncio.to_thread(
            stop_when_dumped, container.id, done, root=self.settings.cgroup_root))
        try:
            reported = await self._checkpoint(request.workload, container.name)
        finally:
            done.set()
            how = await watcher
        if how != "held":
            await self._signal((container,), signal.SIGSTOP, "stop")
            log.warning("container stopped after CRI-O thawed it: it may have run on past "
                        "its checkpoint for a moment", container=container.name, how=how)
        else:
            log.info("container stopped before CRI-O thawed it", container=container.name)
        self.quiesced[container.id] = how
        return reported

    async def release(self, workload: Workload) -> None:
        await self._signal(workload.containers, signal.SIGCONT, "continue", missing_ok=True)

    async def refuse_mode(self, mode: str, workload: Workload | None = None) -> str | None:
        if mode == "lazy":
            return await asyncio.to_thread(kubelet_lazy.lazy_refusal, self, workload)
        return (f"the kubelet dumper does not migrate in mode {mode!r} (CRI-O restores whole "
                "checkpoint images; pre-copy rounds need CRIU driven by the agent)")

    async def start_lazy(self, request: DumpRequest, *, listen: str) -> kubelet_lazy.Serving:
        """Dump all but memory through the kubelet and serve the memory
        (:func:`drivers.agent.kubelet_lazy.start_lazy`)."""
        return await kubelet_lazy.start_lazy(self, request, listen=listen)

    async def restore_lazy(self, request: RestoreRequest, *, pages: tuple[str, int],
                           workdir: Path) -> kubelet_lazy.Receiving:
        """Fetch the pages of a pod CRI-O restores from a memory-less checkpoint image
        (:func:`drivers.agent.kubelet_lazy.restore_lazy`)."""
        return await kubelet_lazy.restore_lazy(self, request, pages=pages, workdir=workdir)

    async def restore(self, request: RestoreRequest) -> RestoreResult:
        images = request.artifact.container_images
        if not images:
            raise RestoreUnsupported(
                f"checkpoint {request.digest} has no checkpoint image per container (it was "
                "not captured through the kubelet and CRI-O), so this node's runtime "
                "cannot restore it")
        if request.latest is None:
            raise RestoreUnsupported("the agent gave no way to watch the pod")
        await self._pull_bases(request)
        sealed = any(layer.sealed for layer in request.artifact.layers)
        if sealed:
            await self._pull_sealed(request, images)
        containers = await self._until_restored(request, set(images), sealed=sealed)
        await self._signal(containers, signal.SIGCONT, "continue")
        return RestoreResult()

    async def _pull_bases(self, request: RestoreRequest) -> None:
        s = self.settings
        if not s.cri_endpoint:
            return
        for layer in request.artifact.layers:
            if not layer.image:
                continue
            present, _ = await self._crictl("inspecti", layer.image)
            if present:  # a pull would ask the registry again, which may have lost it
                continue
            pulled, err = await self._crictl("pull", layer.image)
            if not pulled:
                raise RestoreFailed(f"cannot pull {layer.image}, the base image CRI-O restores "
                                    f"container {layer.container} onto: {err[:400]}")

    async def _pull_sealed(self, request: RestoreRequest, images: Mapping[str, str]) -> None:
        """Each sealed checkpoint image pulled by tag, then proven to be the pinned one."""
        if not self.settings.cri_endpoint:
            raise RestoreFailed("the checkpoint is sealed and CRI-O decrypts only what is "
                                "pulled by tag: the agent needs --cri-endpoint to pull it")
        named = {c.name: c.image for c in request.workload.containers}
        for container, digest in sorted(images.items()):
            pinned = named.get(container, "")
            repository = pinned.split("@", 1)[0]
            if "@" not in pinned or not repository:
                raise RestoreFailed(f"container {container} of {request.workload.key} names "
                                    f"{pinned!r}, not its checkpoint image by digest")
            present, _ = await self._crictl("inspecti", pinned)
            if present:
                continue
            by_tag = f"{repository}:{image_tag(digest)}"
            pulled, err = await self._crictl("pull", by_tag)
            if not pulled:
                # A Go error chain ends with its cause: keep the end, not the start.
                cause = err if len(err) <= 400 else "..." + err[-400:]
                raise RestoreFailed(f"Unsealable: CRI-O could not pull the sealed checkpoint "
                                    f"image {by_tag}: {cause} (is the recipient's key in this "
                                    "node's CRI-O decryption_keys_path?)")
            present, err = await self._crictl("inspecti", pinned)
            if not present:
                raise RestoreFailed(f"{by_tag} is not the pinned {pinned} (the tag moved?): "
                                    f"{err[:200]}")

    async def _crictl(self, *args: str) -> tuple[bool, str]:
        """Run crictl against the node's CRI socket: (succeeded, its stderr)."""
        ok, _, err = await self._crictl_out(*args)
        return ok, err

    async def _crictl_out(self, *args: str) -> tuple[bool, str, str]:
        """Run crictl against the node's CRI socket: (succeeded, its stdout, its stderr)."""
        s = self.settings
        process = await asyncio.create_subprocess_exec(
            s.crictl, "--runtime-endpoint", s.cri_endpoint, "--image-endpoint",
            s.cri_endpoint, *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        return (process.returncode == 0, out.decode(errors="replace"),
                err.decode(errors="replace").strip())

    async def _until_restored(self, request: RestoreRequest, names: set[str], *,
                              sealed: bool = False) -> tuple[Container, ...]:
        assert request.latest is not None
        raced: float | None = None  # when CRI-O was seen to have lacked a base image since pulled
        while True:
            pod = await request.latest(1.0)
            if pod is None:
                raise RestoreFailed(f"pod {request.workload.key} went away during the restore")
            running = restored_containers(pod, names, sealed=sealed)
            if isinstance(running, str):
                if not await self._base_arrived(running):
                    raise RestoreFailed(running)
                if raced is None:
                    raced = time.monotonic()
                    log.info("CRI-O tried the restore before the base image was pulled; "
                             "waiting for the kubelet to try again", pod=request.workload.key)
                elif time.monotonic() - raced > RETRY_SECONDS:
                    raise RestoreFailed(f"{running} (the node has held that image for "
                                        f"{RETRY_SECONDS:g}s and the kubelet did not retry)")
                continue
            if running is not None:
                return running

    async def _base_arrived(self, failure: str) -> bool:
        """Whether ``failure`` is CRI-O's "image not known" for an image the node holds
        now: the kubelet asked before the agent's pull of the base image had ended."""
        lacked = IMAGE_NOT_KNOWN.search(failure)
        if lacked is None or not self.settings.cri_endpoint:
            return False
        present, _ = await self._crictl("inspecti", lacked.group(1))
        return present

    async def _signal(self, containers: Iterable[Container], sig: signal.Signals, verb: str,
                      *, missing_ok: bool = False) -> None:
        for container in containers:
            if not container.id:
                if missing_ok:
                    continue
                raise DumpFailed(f"cannot {verb} container {container.name}: the pod status "
                                 "names no container id yet")
            try:
                await asyncio.to_thread(signal_container, container.id, sig,
                                        root=self.settings.cgroup_root)
            except DumpFailed:
                if not missing_ok:
                    raise

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


def base_image(container: Container) -> str:
    """The image the container runs, by digest when the runtime reported one
    (``registry/repo@sha256:...``): CRI-O restores onto exactly that image, and a tag may
    have moved since (a pull by tag on the restoring node would fetch another image)."""
    digest_ref = container.image_id.partition("://")[2] or container.image_id
    if "@sha256:" in digest_ref and "/" in digest_ref.split("@", 1)[0]:
        return digest_ref
    return container.image


#: What the kubelet's pull of a sealed image by digest says (containers/image#1768): the
#: agent has pulled it by tag meanwhile, and the kubelet's retry finds it.
DIGEST_DECRYPT = "Destination specifies a digest"


def restored_containers(pod: Mapping[str, Any], names: set[str], *,
                        sealed: bool = False) -> tuple[Container, ...] | str | None:
    """The checkpointed containers once all run (with their ids), the runtime's failure
    as a sentence, or ``None`` while CRI-O is still restoring. ``sealed``: the kubelet's
    failed digest pull of a sealed image is waited out (see the module docstring). Pure."""
    statuses = {str(s.get("name")): s for s in
                ((pod.get("status") or {}).get("containerStatuses") or [])
                if isinstance(s, dict)}
    out = []
    for name in sorted(names):
        status = statuses.get(name) or {}
        state = status.get("state") or {}
        waiting = state.get("waiting") or {}
        # The agent pulled and proved the sealed image before waiting: the kubelet's
        # failed digest pull, and the back-off after it, are what it retries past.
        if sealed and (waiting.get("reason") == "ImagePullBackOff" or (
                waiting.get("reason") == "ErrImagePull" and
                DIGEST_DECRYPT in str(waiting.get("message") or ""))):
            return None
        if waiting.get("reason") in FAILED_WAITING:
            return (f"CRI-O did not restore container {name}: {waiting.get('reason')}: "
                    f"{str(waiting.get('message') or '').strip()[:600]}")
        terminated = state.get("terminated")
        if terminated:
            return (f"container {name} exited after the restore (exit code "
                    f"{terminated.get('exitCode')}, {terminated.get('reason') or 'no reason'})")
        if "running" not in state or not status.get("containerID"):
            return None
        out.append(Container(name, str(status.get("image") or ""),
                             str(status.get("containerID"))))
    return tuple(out)


def token_from_file(path: str | os.PathLike[str]) -> str:
    """A service account token, as mounted in the agent's pod."""
    return Path(path).read_text().strip()
