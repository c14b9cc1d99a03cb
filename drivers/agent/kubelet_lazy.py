"""The ``kubelet`` dumper's lazy (post-copy) capability, on real kubelet + CRI-O nodes.

The agent's :class:`~drivers.agent.lazy.LazyDumper` protocol on top of the driver
:mod:`drivers.realnode.lazy` (both nodes' CRI-O run runc through
:mod:`drivers.realnode.runc_wrapper`). Called through
:class:`~drivers.agent.kubelet.KubeletDumper` (``start_lazy``, ``restore_lazy``,
``refuse_mode``), which needs the node's CRI-O storage root, runc root and CRI socket.

- :func:`start_lazy` (source): a lazy request in the container's CRI-O directory, then the
  kubelet's checkpoint call in the background (it returns only after the last page was
  served); once runc's page server listens, the container's tasks are stopped (CRI-O's
  ``--leave-running`` would let them run on after the last page) and the hand-over
  archive is built from the container's directory (CRI-O's archive layout, no memory).
  :class:`Serving` then follows CRIU's ``dump.log``: ``connected`` once the target's
  daemon reached the page server; ``finish`` waits for the kubelet's answer and removes
  the (memory-less) archive it wrote; ``abort`` makes CRIU roll the dump back, and the
  same process runs on.
- :func:`restore_lazy` (target): starts ``criu lazy-pages`` for the page server and
  registers it for the wrapper; when the pod names a hand-over tag (``repo:lazy-...``,
  :func:`controlplane.machines.config.modes.lazy_checkpoint_images`), pushes the
  hand-over there as a checkpoint image and names it by digest in the pod (the kubelet
  pulls a new name at once; the tag it failed to pull before the dump waits out a 10 s
  back-off), having pulled the base image first (CRI-O restores onto it as soon as the
  kubelet has the pushed image); then waits until CRI-O has restored the container.
  :class:`Receiving` waits for every page, then deletes that image from the registry.

Not handled (see ``docs/runtime.md``): the push is plain HTTP without credentials (the
real-node world's registry); holding the target's userfaultfds, so a daemon that dies
cannot leave faults reading zeros; a dump abandoned by a killed agent is not torn down
(runc and CRIU outlive CRI-O).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.logs import get_logger
from drivers.agent.dumper import Container, DumpRequest, RestoreRequest, Workload
from drivers.agent.errors import DumpFailed, PagesLost, RestoreFailed
from drivers.agent.lazy import PagesReceived, PagesServed
from drivers.kube.bodies import with_images
from drivers.kube.errors import KubeApiError
from drivers.kube.resources import MERGE, PODS
from drivers.podman.lazy_checks import lazy_dump_refusal
from drivers.podman.lazy_images import ImageUnreadable, lazy_pages_in
from drivers.podman.lazy_logs import DumpLog, parse_dump_log
from drivers.realnode.images import delete_image, push_checkpoint_image
from drivers.realnode.lazy import (
    PAGE_SIZE,
    Handoff,
    LazyDump,
    LazyFetch,
    LazyMigrationFailed,
    LazyPagesLost,
    container_dir,
    container_tasks,
    request_lazy_dump,
    start_fetch,
)
from drivers.registry.checkpoints import Archive

if TYPE_CHECKING:
    from drivers.agent.kubelet import KubeletDumper

log = get_logger("drivers.agent.kubelet")
#: Seconds runc's page server has to listen once the kubelet was asked.
LISTEN_SECONDS = 60.0
#: What names a hand-over's checkpoint image in a pod (the control plane's tag for it).
LAZY_TAG = ":lazy-"
#: Seconds between two looks at runc's status byte or CRIU's log.
_POLL = 0.02


def lazy_refusal(dumper: KubeletDumper, workload: Workload | None) -> str | None:
    """Why this agent cannot hand ``workload`` over lazily (``None``: it can). Blocking
    (reads the node's pipe limit): run it in a thread."""
    s = dumper.settings
    if s.crio_root is None or s.runc_root is None or not s.cri_endpoint:
        return ("the agent was not given the node's CRI-O storage root, runc root and CRI "
                "socket (where the lazy dump is asked for, the target's lazy-pages daemon "
                "registered, and the container inspected)")
    if workload is not None and len(workload.containers) != 1:
        return (f"pod {workload.key} has {len(workload.containers)} containers; a lazy "
                "migration moves a pod of one container (CRIU serves one container's "
                "pages per page server)")
    return lazy_dump_refusal()


async def start_lazy(dumper: KubeletDumper, request: DumpRequest, *, listen: str) -> Serving:
    """Dump the pod's one container through the kubelet, all but its memory, and serve the
    memory on ``listen``; the source runs on as before if it cannot (``DumpFailed``)."""
    from drivers.agent.kubelet import base_image  # it imports this module

    s, w = dumper.settings, request.workload
    why = await asyncio.to_thread(lazy_refusal, dumper, w)
    if why is not None or s.crio_root is None:
        raise DumpFailed(f"no lazy dump of {w.key}: {why}")
    if len(request.containers) != 1:
        raise DumpFailed(f"a lazy capture moves one container, not {len(request.containers)} "
                         f"(pod {w.key})")
    container = request.containers[0]
    container_id = container.id.partition("://")[2] or container.id
    if not container_id:
        raise DumpFailed(f"cannot dump {w.key}/{container.name} lazily: the pod status "
                         "names no container id yet")
    info = await _inspect(dumper, container_id)
    directory = container_dir(s.crio_root, container_id)
    try:
        dump = await asyncio.to_thread(request_lazy_dump, directory, request.workdir / "lazy",
                                       address=listen)
    except (LazyMigrationFailed, OSError) as exc:
        raise DumpFailed(f"cannot dump {w.key}/{container.name} lazily: {exc}") from exc
    call = asyncio.ensure_future(dumper._checkpoint(w, container.name))
    try:
        await _until_listening(dump, call, what=f"{w.key}/{container.name}")
        await asyncio.to_thread(dump.hold_source, container_tasks(
            int(info["pid"]), cgroups=s.cgroup_root))
        upper = Path(info["runtimeSpec"]["root"]["path"]).parent / "diff"
        handoff = await asyncio.to_thread(dump.write_handoff, upper=upper)
    except BaseException as exc:
        serving = Serving(dumper, dump, call, Archive(container.name, Path(), ""), 0,
                          request.containers)
        await asyncio.shield(serving.abort(limit_seconds=30))
        if isinstance(exc, (OSError, KeyError, ValueError)):
            raise DumpFailed(f"cannot hand {w.key}/{container.name} over lazily: "
                             f"{type(exc).__name__}: {exc}") from exc
        raise
    try:
        pages = await asyncio.to_thread(lazy_pages_in, directory / "checkpoint")
    except (OSError, ImageUnreadable):
        pages = 0  # the count is a report only; the transfer does not need it
    return Serving(dumper, dump, call, Archive(container.name, handoff.archive,
                                               base_image(container)), pages,
                   request.containers)


async def _inspect(dumper: KubeletDumper, container_id: str) -> dict[str, Any]:
    """CRI-O's ``info`` of the container (its first process, its root file system)."""
    found, out, err = await dumper._crictl_out("inspect", container_id)
    if not found:
        raise DumpFailed(f"crictl inspect {container_id}: {err[:300]}")
    try:
        info: dict[str, Any] = json.loads(out)["info"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DumpFailed(f"crictl inspect {container_id} said no info: {out[:200]!r}") from exc
    return info


async def _until_listening(dump: LazyDump, call: asyncio.Future[str], *, what: str) -> None:
    """Until runc's status byte said the page server listens; ``DumpFailed`` when the
    kubelet's call ended first, or after :data:`LISTEN_SECONDS`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LISTEN_SECONDS
    while not dump.listening():
        if call.done():
            failure = call.exception()
            raise DumpFailed(f"the kubelet's checkpoint of {what} ended before CRIU served "
                             f"its pages: {failure or 'it was not lazy (no wrapper?)'}")
        if loop.time() > deadline:
            raise DumpFailed(f"CRIU's page server for {what} did not listen within "
                             f"{LISTEN_SECONDS:g}s")
        await asyncio.wait({call}, timeout=_POLL)


def _archived_dump_log(archive: Path) -> DumpLog:
    """CRIU's ``dump.log`` as CRI-O archived it (an empty log when it is not there)."""
    try:
        with tarfile.open(archive, "r:") as tar:
            member = tar.extractfile("dump.log")
            return parse_dump_log(member.read().decode(errors="replace") if member else "")
    except (OSError, KeyError, tarfile.TarError):
        return DumpLog()


class Serving:
    """A lazy dump as the agent holds it (:class:`drivers.agent.lazy.Serving`)."""

    def __init__(self, dumper: KubeletDumper, dump: LazyDump, call: asyncio.Future[str],
                 archive: Archive, pages: int, containers: tuple[Container, ...]) -> None:
        self.dumper, self.dump, self.call = dumper, dump, call
        self.archive, self.pages, self.containers = archive, pages, containers
        self.port = dump.port
        self._connected = False

    def connected(self) -> bool:
        """Whether CRIU's ``dump.log`` says a daemon reached the page server (sticky: CRI-O
        removes that log once the dump is over)."""
        if not self._connected:
            try:
                text = (self.dump.directory / "dump.log").read_text(errors="replace")
            except FileNotFoundError:
                text = ""
            self._connected = parse_dump_log(text).connected
        return self._connected

    async def finish(self, *, limit_seconds: float) -> PagesServed:
        """The kubelet's answer, after the last page; ``PagesLost`` if the transfer ended
        otherwise (the source's tasks stay stopped: they are the target's now, if a daemon
        had connected; see :meth:`connected`). Cancelled, it leaves the dump as it is:
        :meth:`abort` rolls it back while no daemon has connected."""
        try:
            async with asyncio.timeout(limit_seconds):
                reported = await asyncio.shield(self.call)
        except TimeoutError as exc:
            await self._end()
            raise PagesLost(f"the kubelet's checkpoint did not end within {limit_seconds:g}s; "
                            "the page server was stopped") from exc
        except DumpFailed as exc:
            await self._end()
            raise PagesLost(f"the lazy checkpoint failed: {exc}") from exc
        await self._end()
        # CRI-O removed CRIU's log from the container's directory once it had written its
        # archive (of a dump without memory) with the log in it: read it there, then drop it.
        try:
            archive = self.dumper._local_path(reported)
        except DumpFailed as exc:
            raise PagesLost(f"the transfer ended, but {exc}") from exc
        served = await asyncio.to_thread(_archived_dump_log, archive)
        self._connected = self._connected or served.connected  # the log is gone from disk
        with contextlib.suppress(OSError):
            await asyncio.to_thread(archive.unlink, True)
        if served.served_at is None or served.failed:
            raise PagesLost("the target's lazy-pages daemon left before CRIU had served every "
                            "page")
        return PagesServed(self.pages, self.pages * PAGE_SIZE, served.frozen_seconds)

    async def abort(self, *, limit_seconds: float) -> None:
        """Before a daemon connected: CRIU rolls the dump back and the source runs on."""
        if self.dump.listening():
            await asyncio.to_thread(self.dump.abort, limit_seconds=limit_seconds)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_seconds):
                await asyncio.wait({self.call})
        await self._end()
        if self.call.done() and not self.call.cancelled() and self.call.exception() is None:
            with contextlib.suppress(DumpFailed, OSError):
                await asyncio.to_thread(self.dumper._local_path(self.call.result()).unlink,
                                        True)
        # The tasks were stopped while CRIU held them: the rolled-back source goes on.
        await self.dumper._signal(self.containers, signal.SIGCONT, "continue",
                                  missing_ok=True)

    async def _end(self) -> None:
        """On every way out: no page server left (runc and CRIU outlive CRI-O), no call
        left waiting, no request left for the next checkpoint."""
        await asyncio.to_thread(self.dump.kill_page_server)
        if not self.call.done():
            self.call.cancel()
            with contextlib.suppress(asyncio.CancelledError, DumpFailed):
                await self.call
        await asyncio.to_thread(self.dump.forget)


async def restore_lazy(dumper: KubeletDumper, request: RestoreRequest, *,
                       pages: tuple[str, int], workdir: Path) -> Receiving:
    """Start the daemon that fetches the pages from ``pages`` (``host``, ``port``) and
    register it; return once CRI-O restored the pod's container from its checkpoint image
    (``RestoreFailed`` otherwise: then nothing fetches)."""
    s, w = dumper.settings, request.workload
    if s.runc_root is None:
        raise RestoreFailed(f"cannot restore {w.key} lazily: {lazy_refusal(dumper, None)}")
    if len(request.files) != 1:
        raise RestoreFailed(f"a lazy restore takes one container; the hand-over holds "
                            f"{', '.join(sorted(request.files)) or 'none'}")
    if request.latest is None:
        raise RestoreFailed("the agent gave no way to watch the pod")
    container, archive = next(iter(request.files.items()))
    try:
        fetch = await asyncio.to_thread(start_fetch, Handoff(archive, *pages),
                                        runc_root=s.runc_root, workdir=workdir, criu=s.criu)
    except (LazyMigrationFailed, OSError, ValueError) as exc:
        raise RestoreFailed(f"cannot fetch the pages of {w.key}/{container}: {exc}") from exc
    try:
        ref = {c.name: c.image for c in w.containers}.get(container, "")
        pinned = ""
        # The base image first: the kubelet asks CRI-O to restore as soon as the pod
        # names the pushed image, and CRI-O fails what it cannot find the base of.
        await dumper._pull_bases(request)
        if LAZY_TAG in ref and "@" not in ref:
            pinned = await _push_hand_over(archive, container, ref)
            await _name_pinned(dumper, request, container, pinned)
        restored = await _until_restored(dumper, request, container)
        await dumper._signal(restored, signal.SIGCONT, "continue")
    except BaseException:
        await asyncio.to_thread(fetch.close)
        if pinned:
            await _drop(pinned)
        raise
    return Receiving(fetch, pushed=pinned)


async def _drop(pinned: str) -> None:
    """Delete the pushed hand-over from the registry once nothing can use it: its pages
    were served once, to one daemon (best effort: a leftover is memory-less)."""
    try:
        await asyncio.to_thread(delete_image, pinned)
    except (OSError, ValueError) as exc:
        log.warning("the hand-over's checkpoint image stays in the registry", image=pinned,
                    error=str(exc))


async def _push_hand_over(archive: Path, container: str, ref: str) -> str:
    """The hand-over as the checkpoint image the pod names (``registry/repo:lazy-...``,
    :func:`controlplane.machines.config.modes.lazy_checkpoint_images`), by digest. Plain
    HTTP and no credentials: the loopback registry of the real-node world only, so far."""
    registry, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    try:
        return await asyncio.to_thread(push_checkpoint_image, registry, archive,
                                       container=container, repository=repository, tag=tag,
                                       pinned=True)
    except (OSError, ValueError) as exc:
        raise RestoreFailed(f"cannot push the hand-over of {container} to {ref}: {exc}") from exc


async def _name_pinned(dumper: KubeletDumper, request: RestoreRequest, container: str,
                       pinned: str) -> None:
    """Name the pushed image by digest in the pod: the kubelet pulls a new image name at
    once, where it would wait out its back-off (10 s) on the tag it failed to pull before
    the push; and the pod then pins what CRI-O restores. Without a patcher, or if the
    patch fails, the kubelet's next pull of the tag finds the same image."""
    w = request.workload
    if dumper.patcher is None or request.latest is None:
        return
    pod = await request.latest(0)
    if pod is None:
        return
    body = {"metadata": {"uid": w.uid}, "spec": {"containers": with_images(
        (pod.get("spec") or {}).get("containers"), {container: pinned})}}
    try:
        await dumper.patcher.api.patch(PODS, w.name, body, namespace=w.namespace,
                                       patch_type=MERGE)
    except KubeApiError as exc:
        log.warning("the pod keeps the hand-over's tag: the kubelet pulls it after its "
                    "back-off", pod=w.key, error=str(exc))


async def _until_restored(dumper: KubeletDumper, request: RestoreRequest,
                          container: str) -> tuple[Container, ...]:
    """CRI-O's restore of ``container``, as :meth:`KubeletDumper._until_restored` watches
    it, past the kubelet's failed pulls of the image pushed meanwhile (it pulls again
    after its back-off: 10 s)."""
    from drivers.agent.kubelet import restored_containers  # it imports this module

    assert request.latest is not None
    while True:
        pod = await request.latest(1.0)
        if pod is None:
            raise RestoreFailed(f"pod {request.workload.key} went away during the restore")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        waiting = [((s.get("state") or {}).get("waiting") or {}).get("reason")
                   for s in statuses if isinstance(s, dict) and s.get("name") == container]
        if waiting and waiting[0] in ("ErrImagePull", "ImagePullBackOff"):
            continue
        running = restored_containers(pod, {container})
        if isinstance(running, str):
            raise RestoreFailed(running)
        if running is not None:
            return running


class Receiving:
    """A lazy restore as the agent holds it (:class:`drivers.agent.lazy.Receiving`)."""

    def __init__(self, fetch: LazyFetch, *, pushed: str = "") -> None:
        self.fetch = fetch
        self.pushed = pushed  # the hand-over's checkpoint image, when this agent pushed it

    async def finish(self, *, limit_seconds: float) -> PagesReceived:
        try:
            await asyncio.to_thread(self.fetch.finish, limit_seconds=limit_seconds)
        except LazyPagesLost as exc:
            raise PagesLost(str(exc)) from exc
        finally:
            await asyncio.to_thread(self.fetch.close)
            if self.pushed:
                await _drop(self.pushed)
        # Not the log's total copies: the workload's forked children copy pages too.
        return PagesReceived(*self.fetch.handed_over())
