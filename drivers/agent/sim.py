"""The ``sim`` dumper: captures a simulated workload's state so it survives a migration.

In the simulator (:mod:`drivers.sim`) a pod's in-memory state is its marker annotation
(``sim.controlplane.dev/marker``). This dumper:

- **dump**: stops the workload (annotation ``sim.controlplane.dev/frozen`` = the
  checkpoint id, so a test can see it held), reads the marker of the pod as the agent
  last saw it, and writes one archive per requested container: a tar holding
  ``sim-state.json`` (``{"marker": <value or null>, "pod", "container", "checkpoint_id"}``);
- **release**: removes the frozen annotation (idempotent);
- **restore**: reads ``sim-state.json`` back and returns the marker for the agent to
  write onto the new pod with its restore report.

Format: ``sim-marker/v1``. ``before_dump`` lets tests block or fail a capture at the
point a real dumper would (after the workload was stopped).
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from drivers.agent.dumper import (
    DumpRequest,
    DumpResult,
    RestoreRequest,
    RestoreResult,
    Workload,
)
from drivers.agent.errors import DumpFailed, RestoreFailed, RestoreUnsupported
from drivers.agent.pods import PodPatcher
from drivers.registry.checkpoints import Archive
from drivers.sim import MARKER

FROZEN = "sim.controlplane.dev/frozen"
FORMAT = "sim-marker/v1"
STATE_FILE = "sim-state.json"

Hook = Callable[[DumpRequest], Awaitable[None]]


class SimDumper:
    """Marker capture for the simulated cluster."""

    name = "sim"

    def __init__(self, patcher: PodPatcher, *, before_dump: Hook | None = None) -> None:
        self.patcher = patcher
        self.before_dump = before_dump
        self.dumps = 0  # dumps started (tests count captures with it)
        self._frozen: set[str] = set()  # pod uids this dumper stopped (the cache may lag)

    async def dump(self, request: DumpRequest) -> DumpResult:
        self.dumps += 1
        w = request.workload
        self._frozen.add(w.uid)
        if not await self.patcher.annotate(w.namespace, w.name, w.uid,
                                           {FROZEN: request.checkpoint_id}):
            raise DumpFailed(f"pod {w.key} (uid {w.uid}) is gone")
        if self.before_dump is not None:
            await self.before_dump(request)
        marker = w.annotations.get(MARKER)
        archives = []
        for container in request.containers:
            state = {"marker": marker, "pod": w.key, "container": container.name,
                     "checkpoint_id": request.checkpoint_id}
            path = request.workdir / f"{container.name}.tar"
            await asyncio.to_thread(_write_tar, path, json.dumps(state, sort_keys=True))
            archives.append(Archive(container.name, path, container.image))
        return DumpResult(tuple(archives), FORMAT, engine="sim")

    async def release(self, workload: Workload) -> None:
        if workload.uid in self._frozen or FROZEN in workload.annotations:
            await self.patcher.annotate(workload.namespace, workload.name, workload.uid,
                                        {FROZEN: None})
            self._frozen.discard(workload.uid)

    async def restore(self, request: RestoreRequest) -> RestoreResult:
        if request.artifact.format != FORMAT:
            raise RestoreUnsupported(f"the sim dumper restores {FORMAT} artifacts, not "
                                     f"{request.artifact.format or '(unknown)'!r}")
        markers = set()
        for container, path in sorted(request.files.items()):
            try:
                state = json.loads(await asyncio.to_thread(_read_state, path))
            except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
                raise RestoreFailed(f"archive of {container} is unreadable: {exc}") from exc
            markers.add(state.get("marker"))
        if len(markers) != 1:
            raise RestoreFailed(f"the archives disagree on the workload state: {markers}")
        marker = markers.pop()
        return RestoreResult({} if marker is None else {MARKER: str(marker)})


def _write_tar(path: Path, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(STATE_FILE)
    info.size = len(data)
    info.mode = 0o644
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))


def _read_state(path: Path) -> str:
    with tarfile.open(path, "r") as tar:
        member = tar.getmember(STATE_FILE)
        extracted = tar.extractfile(member)
        if extracted is None:
            raise KeyError(STATE_FILE)
        return extracted.read().decode()
