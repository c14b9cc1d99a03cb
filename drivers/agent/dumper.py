"""The dumper port: how the node agent captures and restores one workload on its node.

A dumper knows one runtime (the kubelet's ContainerCheckpoint API, the simulator's
marker, a VM monitor, a GPU memory service...). The agent owns everything else —
the annotation protocol, locks, deadlines, the registry, reports — so a new runtime is
one class with three methods:

- :meth:`Dumper.dump` captures the requested containers into archives under
  ``request.workdir`` (it may stop the workload to do so; the agent calls
  :meth:`Dumper.release` when the workload may run again);
- :meth:`Dumper.release` resumes a workload the dumper stopped; idempotent, cheap when
  nothing is held (the agent calls it after a non-quiesced dump, when a request is
  withdrawn, and after any failure: the unstick);
- :meth:`Dumper.restore` brings the captured state into a new pod from the pulled
  archives; it may return annotations the agent writes onto the pod with its report.
  A dumper whose *runtime* restores (``runtime_restores = True``: CRI-O restores a
  container whose image is its checkpoint image) gets no archives, only the manifest,
  and watches the pod (``RestoreRequest.latest``) until the runtime has restored it.

Raise :class:`~drivers.agent.errors.DumpFailed` / ``RestoreFailed`` with a message an
operator can act on. Implementations: :mod:`drivers.agent.sim`, :mod:`drivers.agent.kubelet`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from drivers.registry.artifact import CheckpointArtifact
from drivers.registry.checkpoints import Archive


@dataclass(frozen=True)
class Container:
    name: str
    image: str = ""
    id: str = ""  # the runtime's container id as the pod status says (``cri-o://...``)
    image_id: str = ""  # the image it runs, as the pod status says (``repo@sha256:...``)


@dataclass(frozen=True)
class Workload:
    """The pod as the agent last saw it."""

    namespace: str
    name: str
    uid: str
    node: str
    containers: tuple[Container, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DumpRequest:
    checkpoint_id: str
    workload: Workload
    containers: tuple[Container, ...]  # what to capture (the request's, or all of them)
    quiesce: bool
    saver: str  # the class's saver container (JSON), for dumpers that run one
    workdir: Path  # empty, private to this capture; removed after the push


@dataclass(frozen=True)
class DumpResult:
    archives: tuple[Archive, ...]
    format: str  # e.g. "kubelet-checkpoint/v1": recorded in the manifest
    engine: str = ""  # the container engine, when known (org.criu.checkpoint.engine.name)


@dataclass(frozen=True)
class RestoreRequest:
    workload: Workload  # the new pod
    digest: str
    artifact: CheckpointArtifact
    files: Mapping[str, Path]  # container -> archive pulled to local disk (none when the
    # runtime restores: see Dumper.runtime_restores)
    loader: str  # the class's loader container (JSON), for dumpers that run one
    #: The pod as the agent last saw it, after the next change or ``timeout`` seconds
    #: (``None``: gone): how a dumper whose runtime restores watches it do so.
    latest: Callable[[float], Awaitable[Mapping[str, Any] | None]] | None = None


@dataclass(frozen=True)
class RestoreResult:
    annotations: Mapping[str, str] = field(default_factory=dict)


class Dumper(Protocol):
    name: str

    async def dump(self, request: DumpRequest) -> DumpResult: ...

    async def release(self, workload: Workload) -> None: ...

    async def restore(self, request: RestoreRequest) -> RestoreResult: ...
