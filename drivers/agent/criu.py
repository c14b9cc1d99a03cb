"""The ``criu`` dumper: real CRIU checkpoints of a node's containers, through podman.

The node's runtime is a :class:`~drivers.podman.podman.PodmanNode` (on an emulated
node, the storage root the kubelet role runs the node's pods in; the container of a pod
is :func:`~drivers.podman.podman.container_name`):

- **dump**: ``podman container checkpoint --export <workdir>/<container>.tar
  --compress none`` per requested container, ``--leave-running`` unless the request
  quiesces (then ``--keep``: the dump stays beside the stopped container for a release).
  The archive is the one CRI-O and the kubelet write (``checkpoint/``
  with CRIU's images, ``config.dump``, ``spec.dump``, ``rootfs-diff.tar``, the log...):
  uncompressed, it is the checkpoint image's layer as is, and the agent pushes it with
  the CRI-O annotations (:mod:`drivers.registry.artifact`);
- **release**: a container a quiesced checkpoint stopped is restored in place from the
  dump ``--keep`` left beside it (``podman container restore``, which then removes that
  plain-text dump); idempotent;
- **restore**: pulls each container's image on the target node (a restore applies the
  archive's ``rootfs-diff.tar`` onto it), then ``podman container restore --import``
  under the new pod's container name. A container already running under that name (an
  agent restarted mid-restore) is kept; a dead one is replaced.

Modes: stop-and-copy, and lazy (post-copy) between nodes whose podman runs the lazy runc
wrapper (:mod:`drivers.podman.lazy`; the agent's :mod:`drivers.agent.lazy` capability:
:meth:`CriuDumper.start_lazy`, :meth:`CriuDumper.restore_lazy`). Refused before anything
is frozen (:meth:`CriuDumper.refuse_mode`): pre-copy where the kernel has no dirty-page
tracking, naming it (:func:`~drivers.podman.lazy_checks.dirty_tracking_available`), and
where it has, because this dumper has no pre-dump rounds yet; lazy for a pod of more
than one container, a container not created with the wrapper, or a node without
userfaultfd or with too low a pipe limit (:func:`~drivers.podman.lazy_checks.lazy_pages_available`).

Failures (CRIU's, podman's, a missing container) become ``DumpFailed`` /
``RestoreFailed`` with podman's own message. Format: ``criu-archive/v1``; it also
restores ``kubelet-checkpoint/v1`` artifacts, the same archive layout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from drivers.agent.dumper import (
    DumpRequest,
    DumpResult,
    RestoreRequest,
    RestoreResult,
    Workload,
)
from drivers.agent.errors import DumpFailed, PagesLost, RestoreFailed, RestoreUnsupported
from drivers.agent.kubelet import FORMAT as KUBELET_FORMAT
from drivers.agent.lazy import PagesReceived, PagesServed
from drivers.podman.lazy import (
    PAGE_SIZE,
    Handoff,
    LazyDump,
    LazyDumpFailed,
    LazyPagesLost,
    LazyRestore,
    LazyRestoreFailed,
    inspect,
    restore_lazily,
    start_lazy_dump,
)
from drivers.podman.lazy_checks import dirty_tracking_available, lazy_pages_available
from drivers.podman.lazy_images import ImageUnreadable, lazy_pages_in
from drivers.podman.lazy_runc import is_lazy_runtime
from drivers.podman.podman import PodmanNode, RuntimeFailed, container_name
from drivers.registry.checkpoints import Archive

FORMAT = "criu-archive/v1"
ENGINE = "podman"
RESTORABLE = (FORMAT, KUBELET_FORMAT)


def _name(workload: Workload, container: str) -> str:
    return container_name(workload.namespace, workload.name, workload.uid, container)


class CriuDumper:
    """Checkpoints and restores the containers of one node's podman."""

    name = "criu"

    def __init__(self, runtime: PodmanNode) -> None:
        self.runtime = runtime
        self.dumps = 0
        self._dirty_tracking: str | None = None  # the kernel's answer, asked once

    async def refuse_mode(self, mode: str, workload: Workload | None = None) -> str | None:
        if mode == "lazy":
            return await self._refuse_lazy(workload)
        if mode != "precopy":
            return f"the criu dumper does not migrate in mode {mode!r}"
        if self._dirty_tracking is None:
            self._dirty_tracking = await asyncio.to_thread(dirty_tracking_available) or ""
        if self._dirty_tracking:
            return self._dirty_tracking
        return ("this node's kernel tracks dirty pages, but the criu dumper has no pre-dump "
                "rounds yet")

    async def _refuse_lazy(self, workload: Workload | None) -> str | None:
        if workload is not None:
            if len(workload.containers) != 1:
                return (f"pod {workload.key} has {len(workload.containers)} containers; a "
                        "lazy migration moves a pod of one container (CRIU serves one "
                        "container's pages per page server)")
            name = _name(workload, workload.containers[0].name)
            state = await inspect(self.runtime, name)
            runtime = str((state or {}).get("OCIRuntime") or "")
            if state is not None and not await asyncio.to_thread(is_lazy_runtime, runtime):
                return (f"container {workload.containers[0].name} of pod {workload.key} runs "
                        f"under the OCI runtime {runtime!r}, not the lazy runc wrapper "
                        "(podman records a container's runtime when it creates it: the "
                        "node's podman must create it with drivers.podman.lazy_runc's)")
        return await asyncio.to_thread(lazy_pages_available)

    async def start_lazy(self, request: DumpRequest, *, listen: str) -> _Serving:
        """Freeze the pod's one container, dump all but its memory, serve the memory on
        ``listen`` (the page server's port is free there); the source runs on as before
        if it cannot (``DumpFailed``)."""
        w = request.workload
        if len(request.containers) != 1:
            raise DumpFailed(f"a lazy capture moves one container, not "
                             f"{len(request.containers)} (pod {w.key})")
        container = request.containers[0]
        try:
            dump = await start_lazy_dump(self.runtime, _name(w, container.name),
                                         address=listen, workdir=request.workdir / "lazy")
        except (LazyDumpFailed, RuntimeFailed) as exc:
            raise DumpFailed(f"CRIU could not dump {w.key}/{container.name} lazily: "
                             f"{exc}") from exc
        self.dumps += 1
        try:
            pages = await asyncio.to_thread(lazy_pages_in, dump.bundle / "checkpoint")
        except (OSError, ImageUnreadable):
            pages = 0  # the count is a report only; the transfer does not need it
        return _Serving(dump, Archive(container.name, dump.handoff.archive, container.image),
                        pages)

    async def restore_lazy(self, request: RestoreRequest, *, pages: tuple[str, int],
                           workdir: Path) -> _Receiving:
        """Run the one container of the hand-over archive under the new pod's name, its
        memory fetched from the page server ``pages`` (``host``, ``port``); return once it
        runs. A failed restore leaves no container here (``RestoreFailed``)."""
        w = request.workload
        images = {c.name: c.image for c in w.containers}
        if len(request.files) != 1 or next(iter(request.files)) not in images:
            raise RestoreFailed(f"a lazy restore takes one container that pod {w.key} "
                                f"has; the archive holds {', '.join(sorted(request.files))}")
        container, archive = next(iter(request.files.items()))
        try:
            if images[container]:
                await self.runtime.pull(images[container])
            restore = await restore_lazily(self.runtime, Handoff(archive, *pages),
                                           _name(w, container), workdir=workdir)
        except (LazyRestoreFailed, RuntimeFailed) as exc:
            raise RestoreFailed(f"CRIU could not restore {w.key}/{container} lazily: "
                                f"{exc}") from exc
        return _Receiving(restore)

    async def dump(self, request: DumpRequest) -> DumpResult:
        self.dumps += 1
        w = request.workload
        archives = []
        for container in request.containers:
            name = _name(w, container.name)
            state = await self.runtime.state(name)
            if state is None or not state.running:
                seen = "is not there" if state is None else f"is {state.status}, not running"
                raise DumpFailed(f"container {container.name} of pod {w.key} {seen} on node "
                                 f"{w.node}'s runtime (podman name {name})")
            path = request.workdir / f"{container.name}.tar"
            try:
                await self.runtime.checkpoint(name, path, leave_running=not request.quiesce)
            except RuntimeFailed as exc:
                raise DumpFailed(f"CRIU could not checkpoint {w.key}/{container.name}: "
                                 f"{exc}") from exc
            archives.append(Archive(container.name, path, container.image))
        return DumpResult(tuple(archives), FORMAT, engine=ENGINE)

    async def release(self, workload: Workload) -> None:
        for container in workload.containers:
            name = _name(workload, container.name)
            state = await self.runtime.state(name)
            # A checkpoint that failed after CRIU stopped the process (its archive not
            # written: a full disk) leaves the dump but not the "checkpointed" state.
            if state is not None and not state.running and (state.checkpointed or
                                                            state.kept_dump):
                try:
                    await self.runtime.restore_in_place(name)
                except RuntimeFailed as exc:
                    raise DumpFailed(f"could not resume {workload.key}/{container.name} "
                                     f"after its checkpoint: {exc}") from exc

    async def restore(self, request: RestoreRequest) -> RestoreResult:
        if request.artifact.format not in RESTORABLE:
            raise RestoreUnsupported(f"the criu dumper restores {' and '.join(RESTORABLE)} "
                                     f"artifacts, not {request.artifact.format or '(unknown)'!r}")
        w = request.workload
        images = {c.name: c.image for c in w.containers}
        for container, path in sorted(request.files.items()):
            if container not in images:
                raise RestoreFailed(f"the checkpoint holds container {container!r}, which "
                                    f"pod {w.key} does not have (it has "
                                    f"{', '.join(sorted(images)) or 'none'})")
            name = _name(w, container)
            try:
                state = await self.runtime.state(name)
                if state is not None and state.running:
                    continue  # restored already (an agent restarted mid-restore)
                if state is not None:
                    await self.runtime.remove(name)
                if images[container]:
                    await self.runtime.pull(images[container])
                await self.runtime.restore_archive(path, name)
            except RuntimeFailed as exc:
                raise RestoreFailed(f"CRIU could not restore {w.key}/{container}: "
                                    f"{exc}") from exc
        return RestoreResult()



class _Serving:
    """A lazy dump as the agent holds it (:class:`drivers.agent.lazy.Serving`)."""

    def __init__(self, dump: LazyDump, archive: Archive, pages: int) -> None:
        self.dump, self.archive, self.pages = dump, archive, pages
        self.port = dump.handoff.port

    def connected(self) -> bool:
        return self.dump.dump_log().connected

    async def finish(self, *, limit_seconds: float) -> PagesServed:
        try:
            log = await self.dump.finish(limit_seconds=limit_seconds)
        except LazyPagesLost as exc:
            raise PagesLost(str(exc)) from exc
        if log.served_at is None or log.failed:
            # The daemon's connection ended (its restore failed, say) before CRIU said the
            # transfer was complete: CRIU ended the source all the same.
            raise PagesLost(f"{self.dump.name}: the target's lazy-pages daemon left before "
                            "CRIU had served every page; the source was removed")
        return PagesServed(self.pages, self.pages * PAGE_SIZE, log.frozen_seconds)

    async def abort(self, *, limit_seconds: float) -> None:
        try:
            await self.dump.abort(limit_seconds=limit_seconds)
        except LazyPagesLost as exc:
            raise PagesLost(str(exc)) from exc
        except LazyDumpFailed as exc:
            raise DumpFailed(str(exc)) from exc


class _Receiving:
    """A lazy restore as the agent holds it (:class:`drivers.agent.lazy.Receiving`)."""

    def __init__(self, restore: LazyRestore) -> None:
        self.restore = restore

    async def finish(self, *, limit_seconds: float) -> PagesReceived:
        try:
            log = await self.restore.finish(limit_seconds=limit_seconds)
        except LazyPagesLost as exc:
            raise PagesLost(str(exc)) from exc
        return PagesReceived(log.copied, log.expected)
