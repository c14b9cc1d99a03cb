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
  before a daemon connected — the page server's own end included — it aborts the dump
  (the source runs on). A dump an earlier agent left, which a daemon had taken over, is
  adopted and reported instead (:mod:`drivers.podman.lazy_watch`).
- :func:`pages_arrive` (target, after the restored pod was marked): waits until every
  page arrived and marks ``pages-received``, or ``restore-failure: PagesLost: ...``;
  :func:`pages_unjudged`, for a pod an earlier agent of this node restored lazily and
  died before it saw every page arrive, marks ``PagesLost`` at once.

Used by :mod:`drivers.agent.agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.engine.observation import PodView
from controlplane.logs import get_logger
from controlplane.machines.contract import protocol
from drivers.agent.dumper import DumpRequest, RestoreRequest
from drivers.agent.errors import DumpFailed, PagesLost
from drivers.kube.resources import PODS
from drivers.podman.lazy_watch import verdict_path
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
#: Seconds between two looks for the verdict of a dead agent's lazy restore.
_VERDICT_POLL = 0.5


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
    if await asyncio.to_thread(serving.connected):
        # This capture's dump, started by an agent that died after the target's daemon
        # had taken the page server: it is the target's, and ended; report it.
        record.committed = True
        log.info("adopted the lazy dump of an earlier agent", pod=f"{pod.namespace}/{pod.name}",
                 checkpoint=request.checkpoint_id)
        left = record.deadline - asyncio.get_running_loop().time() - _MARGIN
        await _transferred(agent, pod, request, record,
                           await serving.finish(limit_seconds=max(1.0, left)))
        return
    try:
        pages = handoff.advertised(serving.port)
        record.offer, report = await handoff.offer(
            request.checkpoint_id, [serving.archive], source_uid=pod.uid,
            target_node=record.target, format=FORMAT, pages=pages)
        await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, report.annotation())
        await agent._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                            reason=f"dumped all but memory; serving pages to {record.target}")
        left = record.deadline - asyncio.get_running_loop().time() - _MARGIN
        # Watched from now on: a dump that ends while the offer waits for its target
        # (CRIU killed) must not leave the source unnoticed until the deadline.
        finish = asyncio.ensure_future(serving.finish(limit_seconds=max(1.0, left)))
        try:
            delivered = asyncio.ensure_future(record.offer.delivered())
            try:
                await asyncio.wait({finish, delivered}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                delivered.cancel()
            if delivered.done() and not delivered.cancelled():
                delivered.result()  # withdrawn before the target had it: HandoffRefused
            while not finish.done() and not await asyncio.to_thread(serving.connected):
                await asyncio.wait({finish}, timeout=_POLL)
        except BaseException:
            finish.cancel()  # abort, below, waits for the dump's end itself
            with contextlib.suppress(asyncio.CancelledError):
                await finish
            raise
        ended = _ended_short(finish)
        if ended is not None and not await asyncio.to_thread(serving.connected):
            # The dump ended and no daemon ever reached the page server (CRIU killed, say),
            # as the dumper says (not PagesLost): no target can run, and the source is still
            # there to go on (abort, below).
            raise DumpFailed(f"the lazy dump of {names} ended before {record.target}'s "
                             f"lazy-pages daemon reached its page server ({ended}); no page "
                             "left the source")
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
    await _transferred(agent, pod, request, record, served)


async def _transferred(agent: NodeAgent, pod: PodView, request: CaptureRequest,
                       record: _Capture, served: PagesServed) -> None:
    await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, protocol.pages_report(
        request.checkpoint_id, pages=served.pages, size=served.bytes, seconds=served.seconds))
    await agent._report(pod, request.checkpoint_id, protocol.ReportState.TRANSFERRED,
                        reason=f"every page ({served.pages}, {served.bytes} bytes) went to "
                               f"{record.target}; the source was removed")


def _ended_short(finish: asyncio.Future[PagesServed]) -> str | None:
    """Why a lazy dump ended before a target took it, when ``finish`` failed saying so:
    any error but ``PagesLost`` (a dumper's word for a transfer a daemon had begun, which
    stands). ``None``: not ended, ended well, or with ``PagesLost``."""
    if not finish.done() or finish.cancelled():
        return None
    error = finish.exception()
    return None if error is None or isinstance(error, PagesLost) else str(error)


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


def unjudged(pod: PodView) -> protocol.RestoreHandoff | None:
    """The handoff of a pod this node restored from a stream and no agent marked
    ``pages-received`` or a failure on: perhaps a lazy restore whose agent died before
    its pages all arrived (:func:`pages_unjudged` asks its source)."""
    if protocol.PAGES_RECEIVED in pod.annotations or \
            pod.annotations.get(protocol.RESTORE_FAILURE) or \
            protocol.RESTORED_FROM_HANDOFF not in pod.annotations:
        return None
    try:
        return protocol.restore_handoff(pod.annotations)
    except ValueError:
        return None


async def pages_unjudged(agent: NodeAgent, pod: PodView,
                         request: protocol.RestoreHandoff) -> None:
    """(target, a new agent) ``pod`` was restored from ``request``'s handoff by an earlier
    agent of this node; if that hand-over was lazy (its source offered a page server) and
    the source pod is still there (deleted only once every page arrived, or the workload
    was lost), the agent that watched the pages died before it saw them all: their
    arrival cannot be proven any more (its daemon's log went with its work directory) and
    no one holds the restored tasks' faults (a daemon that ends short would let them read
    zeros). So ``restore-failure: PagesLost`` is marked at once, and the migration
    removes the pod, instead of letting it run unproven until the transfer deadline.

    Unless a watchdog watched the daemon in that agent's stead (the criu dumper's:
    :mod:`drivers.podman.lazy_watch`): its verdict, once the daemon ended, says whether
    every page arrived (``pages-received``) or not (``PagesLost``, the container removed)."""
    verdict = await _verdict(agent, pod)
    if verdict is not None:
        await _judged(agent, pod, request.checkpoint_id, verdict)
        return
    page = await agent.patcher.api.list_page(PODS, namespace=request.namespace,
                                             field_selector=f"metadata.name={request.name}")
    sources = [p for p in page.get("items") or [] if isinstance(p, dict)]
    meta = (sources[0].get("metadata") or {}) if sources else {}
    if str(meta.get("uid") or "") != request.source_uid:
        return  # the source is gone: every page arrived, or the workload was lost already
    try:
        report = protocol.handoff_report(meta.get("annotations") or {}, request.checkpoint_id)
    except ValueError:
        report = None
    if report is None or not report.pages:
        return  # a streamed restore: whole when it ran
    reason = (f"PagesLost: the node agent that watched the pages of checkpoint "
              f"{request.checkpoint_id} arrive stopped before they all had; a new one cannot "
              "prove they did, so the restored workload must not run on")
    agent.stats.restore_failures += 1
    log.warning("lazy restore left unjudged by an earlier agent",
                pod=f"{pod.namespace}/{pod.name}", checkpoint=request.checkpoint_id)
    await agent.patcher.annotate(pod.namespace, pod.name, pod.uid,
                                 {protocol.RESTORE_FAILURE: reason})


async def _verdict(agent: NodeAgent, pod: PodView) -> dict[str, Any] | None:
    """The watchdog's verdict on ``pod``'s lazy restore once it has one (``None``: no
    watchdog); a verdict still pending at the restore timeout counts as lost."""
    path = verdict_path(agent.settings.workdir / f"lazy-{pod.uid}")
    deadline = asyncio.get_running_loop().time() + agent.settings.restore_timeout
    while True:
        try:
            found = json.loads(await asyncio.to_thread(path.read_text))
        except (OSError, ValueError):
            return None
        if not isinstance(found, dict):
            return None
        if not found.get("pending"):
            await asyncio.to_thread(path.unlink, True)
            return found
        if asyncio.get_running_loop().time() > deadline:
            return {"lost": "its watchdog gave no verdict within the restore timeout"}
        await asyncio.sleep(_VERDICT_POLL)


async def _judged(agent: NodeAgent, pod: PodView, checkpoint_id: str,
                  verdict: dict[str, Any]) -> None:
    marks: dict[str, str | None]
    if "pages" in verdict and "expected" in verdict:
        marks = dict(protocol.pages_received(checkpoint_id, pages=int(verdict["pages"]),
                                             expected=int(verdict["expected"])))
        log.info("every page arrived while no agent watched", pod=f"{pod.namespace}/{pod.name}",
                 checkpoint=checkpoint_id, pages=verdict["pages"])
    else:
        agent.stats.restore_failures += 1
        marks = {protocol.RESTORE_FAILURE: f"PagesLost: {verdict.get('lost', 'no verdict')}"}
        log.warning("lazy restore lost its pages while no agent watched",
                    pod=f"{pod.namespace}/{pod.name}", checkpoint=checkpoint_id)
    await agent.patcher.annotate(pod.namespace, pod.name, pod.uid, marks)
