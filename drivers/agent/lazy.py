"""Lazy (post-copy) migration in the node agent: the dumper's optional capability and the
two jobs that use it (docs/protocol.md, "Lazy handoff").

A dumper that can hand a workload over without its memory has, beside the three methods
of :class:`~drivers.agent.dumper.Dumper`, :meth:`LazyDumper.start_lazy` (source: dump
all but the memory, serve the memory) and :meth:`LazyDumper.restore_lazy` (target: run
the workload at once, its memory fetched page by page); the agent discovers them as it
discovers ``refuse_mode`` (:func:`lazy_dumper`). Only the criu dumper has them.

- :func:`capture_lazily` (source, a capture with mode ``lazy`` and ``capture-handoff``):
  offers the hand-over archive on the handoff server, announces it with the page server
  in ``report-handoff``, waits until the target's lazy-pages daemon reached the page
  server (from then on the workload is the target's: a withdrawal no longer aborts),
  then until every page was served, and reports ``report-pages`` and ``Transferred``.
  Nothing is pushed: the memory never rests anywhere. Cancelled, timed out or failed
  before a daemon connected, it aborts the dump (the source runs on).
- :func:`pages_arrive` (target, after the restored pod was marked): waits until every
  page arrived and marks ``pages-received``, or ``restore-failure: PagesLost: ...``.

Used by :mod:`drivers.agent.agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.engine.observation import PodView
from controlplane.logs import get_logger
from controlplane.machines.contract import protocol
from drivers.agent.dumper import DumpRequest, RestoreRequest
from drivers.agent.errors import PagesLost
from drivers.registry.checkpoints import Archive

if TYPE_CHECKING:
    from drivers.agent.agent import NodeAgent, _Capture
    from drivers.agent.requests import CaptureRequest

log = get_logger("drivers.agent")
#: The format a lazy hand-over archive states in the stream's HEAD (no memory in it).
FORMAT = "criu-lazy-archive/v1"
#: Seconds kept from the capture's deadline for the reports after the last page.
_MARGIN = 5.0
#: Seconds between two looks at the page server's log for the target's daemon.
_POLL = 0.05


@dataclass(frozen=True)
class PagesServed:
    pages: int  # left to the page server by the dump (all served once it finished)
    bytes: int
    seconds: float | None  # the source frozen -> its last page served (CRIU's log)


@dataclass(frozen=True)
class PagesReceived:
    pages: int  # copied into the restored tasks
    expected: int  # the tasks left to the daemon


class Serving(Protocol):
    """A lazy dump whose page server listens."""

    archive: Archive  # everything but the memory: what the target restores from
    port: int  # the page server's

    def connected(self) -> bool:
        """A target's lazy-pages daemon reached the page server (it cannot be undone)."""
        ...

    async def finish(self, *, limit_seconds: float) -> PagesServed: ...

    async def abort(self, *, limit_seconds: float) -> None: ...


class Receiving(Protocol):
    """A lazy restore whose workload runs while its memory arrives."""

    async def finish(self, *, limit_seconds: float) -> PagesReceived: ...


class LazyDumper(Protocol):
    async def start_lazy(self, request: DumpRequest, *, listen: str) -> Serving: ...

    async def restore_lazy(self, request: RestoreRequest, *, pages: tuple[str, int],
                           workdir: Path) -> Receiving: ...


def lazy_dumper(dumper: Any) -> LazyDumper | None:
    """``dumper`` as a lazy one, or ``None`` when it cannot hand over lazily."""
    if callable(getattr(dumper, "start_lazy", None)) and \
            callable(getattr(dumper, "restore_lazy", None)):
        return dumper  # type: ignore[no-any-return]
    return None


async def capture_lazily(agent: NodeAgent, pod: PodView, request: CaptureRequest,
                         dump: DumpRequest, record: _Capture, lazy: LazyDumper) -> None:
    """The source's lazy capture, from the dump to ``Transferred`` (see the module)."""
    handoff = agent.handoff
    assert handoff is not None
    names = ", ".join(c.name for c in dump.containers)
    await agent._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                        reason=f"dumping {names} lazily with the {agent.dumper.name} dumper")
    serving = await lazy.start_lazy(dump, listen=handoff.settings.host)
    try:
        pages = handoff.advertised(serving.port)
        record.offer, report = await handoff.offer(
            request.checkpoint_id, [serving.archive], source_uid=pod.uid,
            target_node=record.target, format=FORMAT, pages=pages)
        await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, report.annotation())
        await agent._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                            reason=f"dumped all but memory; serving pages to {record.target}")
        await record.offer.delivered()
        left = record.deadline - asyncio.get_running_loop().time() - _MARGIN
        finish = asyncio.ensure_future(serving.finish(limit_seconds=max(1.0, left)))
        try:
            while not finish.done() and not await asyncio.to_thread(serving.connected):
                await asyncio.wait({finish}, timeout=_POLL)
        except BaseException:
            finish.cancel()  # abort, below, waits for the dump's end itself
            with contextlib.suppress(asyncio.CancelledError):
                await finish
            raise
        # The daemon took the page server: the end of its connection ends the source, so
        # the workload is the target's whatever happens to this request now.
        record.committed = True
        served = await finish
    except BaseException:
        if not record.committed:
            # No target's daemon reached the page server: the source goes on as before
            # (a PagesLost from here says one did after all).
            await asyncio.shield(serving.abort(limit_seconds=30))
        raise
    await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, protocol.pages_report(
        request.checkpoint_id, pages=served.pages, size=served.bytes, seconds=served.seconds))
    await agent._report(pod, request.checkpoint_id, protocol.ReportState.TRANSFERRED,
                        reason=f"every page ({served.pages}, {served.bytes} bytes) went to "
                               f"{record.target}; the source was removed")


async def pages_arrive(agent: NodeAgent, pod: PodView, checkpoint_id: str,
                       receiving: Receiving, workdir: Path) -> None:
    """The target's wait for the memory of a pod it restored lazily (see the module)."""
    marks: dict[str, str | None]
    try:
        got = await receiving.finish(limit_seconds=agent.settings.restore_timeout)
        marks = dict(protocol.pages_received(checkpoint_id, pages=got.pages,
                                             expected=got.expected))
        log.info("every page arrived", pod=f"{pod.namespace}/{pod.name}",
                 checkpoint=checkpoint_id, pages=got.pages)
    except PagesLost as exc:
        agent.stats.restore_failures += 1
        marks = {protocol.RESTORE_FAILURE: exc.report()[:1024]}
        log.warning("lazy restore lost its pages", pod=f"{pod.namespace}/{pod.name}",
                    reason=str(exc))
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    with contextlib.suppress(Exception):
        await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, marks)
