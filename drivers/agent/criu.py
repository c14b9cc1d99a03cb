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

Modes: stop-and-copy. Pre-copy is refused before anything is frozen
(:meth:`CriuDumper.refuse_mode`): where the kernel has no dirty-page tracking, naming it
(:func:`~drivers.podman.lazy_checks.dirty_tracking_available`); where it has, because this dumper
has no pre-dump rounds yet.

Failures (CRIU's, podman's, a missing container) become ``DumpFailed`` /
``RestoreFailed`` with podman's own message. Format: ``criu-archive/v1``; it also
restores ``kubelet-checkpoint/v1`` artifacts, the same archive layout.
"""

from __future__ import annotations

import asyncio

from drivers.agent.dumper import (
    DumpRequest,
    DumpResult,
    RestoreRequest,
    RestoreResult,
    Workload,
)
from drivers.agent.errors import DumpFailed, RestoreFailed, RestoreUnsupported
from drivers.agent.kubelet import FORMAT as KUBELET_FORMAT
from drivers.podman.lazy_checks import dirty_tracking_available
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

    async def refuse_mode(self, mode: str) -> str | None:
        if mode != "precopy":
            return f"the criu dumper does not migrate in mode {mode!r}"
        if self._dirty_tracking is None:
            self._dirty_tracking = await asyncio.to_thread(dirty_tracking_available) or ""
        if self._dirty_tracking:
            return self._dirty_tracking
        return ("this node's kernel tracks dirty pages, but the criu dumper has no pre-dump "
                "rounds yet")

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
            if state is not None and state.checkpointed and not state.running:
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

