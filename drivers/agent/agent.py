"""The node agent: performs the capture and restore requests on the pods of its node.

One agent per node (a DaemonSet in a cluster, an asyncio task per simulated node). It
watches the pods bound to its node (:mod:`drivers.agent.pods`) and, on every change,
decides synchronously (no I/O while deciding, so two events cannot race) and starts
at most one job per pod:

**Capture** (the pod carries ``capture-checkpoint-id``...): judged first
(:func:`~drivers.agent.requests.judge_capture`: UID and node provenance, version,
artifact) — a refused request gets a ``Failed`` report with the reason. Otherwise one
capture job per checkpoint (the in-flight lock: the same request seen again, or
reissued, captures once; a report ``Pushed``/``Failed`` for it on the pod means it is
done, which survives agent restarts). The job reports ``Capturing`` (with the stage in
``report-reason``), runs the dumper, releases the workload at once unless the request
quiesces it, pushes the artifact (:func:`~drivers.registry.checkpoints.push_checkpoint`,
provenance in the manifest), and reports ``Pushed`` with the digest. The job has a
deadline (``capture_timeout``). On any failure — dumper, registry, deadline — it reports
``Failed`` with the reason and releases the workload (the unstick): a workload is never
left stopped by a capture that did not succeed. A request removed while its job runs
(withdrawn) cancels the job, releases the workload and reports ``Failed: Withdrawn``; a
request removed after a quiesced capture releases the workload (wake in place).

**Restore** (a pod created with ``restore-artifact`` = ``registry/repo@sha256:...``): one
job per pod: pull the artifact by digest (digests verified), check it is the checkpoint
the request names, let the dumper restore, and mark the pod with ``restored-from-digest``
and a fresh ``instance-id`` (``<pod uid>.<random>``: bound to this pod, so marks copied
from a template never count), or ``restore-failure``.

**Handoff** (with a handoff key, :mod:`drivers.agent.handoffs`): a capture whose request
carries ``capture-handoff`` also offers its archives to the target node's agent, beside
the push, and announces it in ``report-handoff``; after ``Pushed`` the job keeps the
offer open until it is delivered, the request is withdrawn or the deadline passes. A pod
created with ``restore-handoff`` is restored from that stream and marked
``restored-from-handoff``. A capture in mode ``lazy`` hands the workload over without its
memory, which the target then fetches page by page (:mod:`drivers.agent.lazy`).

Built by :mod:`drivers.agent.runner` (kube connection, registry, dumper) or by tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.clock import Clock, SystemClock, new_id
from controlplane.engine.observation import PodView
from controlplane.logs import get_logger
from controlplane.machines.base.refs import ArtifactRef
from controlplane.machines.contract import protocol
from drivers.agent.dumper import Container, Dumper, DumpRequest, RestoreRequest, Workload
from drivers.agent.errors import AgentError, RequestRefused, RestoreFailed, RestoreUnsupported
from drivers.agent.handoff import HandoffFailed, Offer, Received, frames
from drivers.agent.handoffs import Handoff, HandoffUnavailable
from drivers.agent.lazy import (
    LazyDumper,
    Receiving,
    capture_lazily,
    lazy_dumper,
    pages_arrive,
    pages_unjudged,
    unjudged,
)
from drivers.agent.modes import check_mode
from drivers.agent.pods import PodPatcher
from drivers.agent.requests import (
    CaptureRequest,
    capture_request,
    judge_capture,
    restore_done,
    restore_request,
)
from drivers.agent.sealing import Sealing, read_seal
from drivers.kube.client import KubeObject
from drivers.kube.errors import KubeApiError
from drivers.kube.views import pod_view
from drivers.registry.artifact import (
    CheckpointArtifact,
    Layer,
    Provenance,
    read_checkpoint_manifest,
)
from drivers.registry.checkpoints import Archive, Pushed, pull_checkpoint, push_checkpoint
from drivers.registry.errors import RegistryError
from drivers.registry.port import Descriptor, Registry

log = get_logger("drivers.agent")
REMEMBERED = 4096  # finished captures kept in memory (the pod's report covers the rest)


@dataclass(frozen=True)
class AgentSettings:
    node: str
    workdir: Path  # node-local scratch space for archives
    capture_timeout: float = 600.0  # the whole capture: queueing + dump + push + reports
    restore_timeout: float = 600.0  # pull + restore + report
    parallel: int = 4  # captures dumping/pushing at once on this node (the rest queue)


@dataclass
class _Capture:
    """One capture job; ``cancel_reason`` says why it was cancelled (empty: agent stop)."""

    checkpoint_id: str
    task: asyncio.Task[None] | None = None
    cancel_reason: str = ""
    previous: asyncio.Task[None] | None = None  # a superseded job: let it unstick first
    #: The job failed and is reporting and releasing: nothing may cancel that. (Its own
    #: Failed report makes the control plane withdraw the request at once; cancelling
    #: then interrupted the release and left a quiesced workload stopped.)
    unsticking: bool = False
    #: A handed-off capture: its offer on this agent's handoff server (until delivered,
    #: withdrawn or the deadline), and whether the push already ended in ``Pushed``.
    offer: Offer | None = None
    target: str = ""
    pushed: bool = False
    #: A lazy capture whose target's daemon reached the page server: the target owns the
    #: workload from then on, so a withdrawal no longer aborts (the pages go on).
    committed: bool = False
    deadline: float = 0.0  # loop time the capture must end by


@dataclass
class AgentStats:
    captures: int = 0
    pushed: int = 0
    transferred: int = 0  # lazy captures whose every page reached the target
    failed: int = 0
    refused: int = 0
    restores: int = 0
    restore_failures: int = 0
    reports: list[tuple[str, str, str]] = field(default_factory=list)  # (pod, state, reason)
    #: Seconds from each restore pod's ``creationTimestamp`` to this agent starting its
    #: restore (the last :data:`REMEMBERED`): how late the pod's watch event reached the
    #: agent. The timestamp has second precision, so each figure is high by up to 1 s.
    restore_delays: deque[float] = field(default_factory=lambda: deque(maxlen=REMEMBERED))


class NodeAgent:
    """Serves capture and restore requests on one node."""

    def __init__(self, settings: AgentSettings, *, patcher: PodPatcher, registry: Registry,
                 dumper: Dumper, clock: Clock | None = None,
                 sealing: Sealing | None = None, handoff: Handoff | None = None) -> None:
        self.settings = settings
        self.handoff = handoff  # None: started without --handoff-key
        self.sealing = sealing or Sealing()
        self.node = settings.node
        self.patcher = patcher
        self.registry = registry
        self.dumper = dumper
        self.clock = clock or SystemClock()
        self.stats = AgentStats()
        self._pods: dict[str, KubeObject] = {}  # uid -> latest object seen
        self._captures: dict[str, _Capture] = {}  # pod uid -> the job in flight
        self._finished: OrderedDict[tuple[str, str], str] = OrderedDict()  # (uid, id) -> how
        self._held: dict[str, str] = {}  # pod uid -> checkpoint id left stopped (quiesce)
        self._seen: set[str] = set()
        self._restoring: dict[str, asyncio.Task[None]] = {}  # pod uid -> the job in flight
        self._restored: dict[str, str] = {}  # pod uid -> "restored" | "failed"
        self._restore_stage: dict[str, str] = {}  # pod uid -> what a restore waits for
        #: pod uid -> a lazy restore whose pages still arrive, once its marks are written
        self._receiving: dict[str, tuple[str, Receiving, Path]] = {}
        self._changed: dict[str, asyncio.Event] = {}  # pod uid -> set on each change
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._slots = asyncio.Semaphore(max(1, settings.parallel))

    # --- the watch hook ------------------------------------------------------------------

    def on_change(self, old: KubeObject | None, new: KubeObject | None) -> None:
        """The pod cache's hook: decide about the pod that changed (never blocks)."""
        if new is None:
            uid = _uid(old)
            self._pods.pop(uid, None)
            self._cancel_capture(uid, "PodGone: the pod was deleted during the capture")
            restoring = self._restoring.pop(uid, None)
            if restoring is not None:
                restoring.cancel()
            self._held.pop(uid, None)
            self._restored.pop(uid, None)
            self._seen.discard(uid)
            gone = self._changed.pop(uid, None)
            if gone is not None:
                gone.set()
            return
        if old is not None and _uid(old) != _uid(new):
            self.on_change(old, None)
        self.reconcile(new)

    def reconcile(self, obj: KubeObject) -> None:
        pod = pod_view(obj)
        if pod.node != self.node:
            return
        self._pods[pod.uid] = obj
        changed = self._changed.get(pod.uid)
        if changed is not None:
            changed.set()
        first_sight = pod.uid not in self._seen
        self._seen.add(pod.uid)
        if pod.deleting:
            self._cancel_capture(pod.uid, "PodGone: the pod is terminating")
            return
        self._reconcile_capture(pod, first_sight=first_sight)
        self._reconcile_restore(pod)

    # --- capture -------------------------------------------------------------------------

    def _reconcile_capture(self, pod: PodView, *, first_sight: bool) -> None:
        request = capture_request(pod)
        running = self._captures.get(pod.uid)
        if request is None:
            if running is not None and running.committed:
                log.info("the capture request was removed while the pages go to the "
                         "target, which runs the workload: the transfer goes on",
                         pod=f"{pod.namespace}/{pod.name}", checkpoint=running.checkpoint_id)
            elif running is not None and running.pushed:
                self._cancel_capture(pod.uid, f"Withdrawn: the capture request was removed "
                                              f"before {running.target} fetched the checkpoint")
            elif running is not None:
                self._cancel_capture(pod.uid, "Withdrawn: the request was removed before the "
                                              "capture finished; the capture was aborted")
            elif pod.uid in self._held or (first_sight and _reported(pod) in (
                    protocol.ReportState.CAPTURING, protocol.ReportState.PUSHED)):
                self._held.pop(pod.uid, None)
                self._spawn(self._release(pod), f"release {pod.namespace}/{pod.name}")
            return
        previous = None
        if running is not None:
            if running.checkpoint_id == request.checkpoint_id:
                return  # in flight: the same request seen again captures once
            self._cancel_capture(pod.uid, f"Superseded: the pod now asks for checkpoint "
                                          f"{request.checkpoint_id}")
            previous = running.task
        key = (pod.uid, request.checkpoint_id)
        if key in self._finished:
            return
        if protocol.capture_report(pod, request.checkpoint_id) is not None and \
                _reported(pod) in (protocol.ReportState.PUSHED, protocol.ReportState.FAILED,
                                   protocol.ReportState.TRANSFERRED) \
                and request.source_uid == pod.uid:
            self._finish(key, "reported")  # done by an earlier incarnation of this agent
            if request.quiesce:  # which may have left it held: the withdrawal releases it
                self._held[pod.uid] = request.checkpoint_id
            return
        if self._orphaned_handoff(pod, request):
            return
        try:
            judge_capture(request, pod, node=self.node)
        except RequestRefused as exc:
            self._finish(key, "refused")
            self.stats.refused += 1
            log.warning("capture request refused", pod=f"{pod.namespace}/{pod.name}",
                        checkpoint=request.checkpoint_id, reason=str(exc))
            self._spawn(self._report(pod, request.checkpoint_id, protocol.ReportState.FAILED,
                                     reason=exc.report()), "refusal report")
            return
        record = _Capture(request.checkpoint_id, previous=previous)
        record.task = self._spawn(self._capture(pod, request, record),
                                  f"capture {request.checkpoint_id}")
        self._captures[pod.uid] = record

    def _orphaned_handoff(self, pod: PodView, request: CaptureRequest) -> bool:
        """A quiesced stop-and-copy capture an earlier incarnation of this agent offered to
        its target and did not finish (killed): the target may have fetched it and run it,
        so it is neither captured again nor woken here. It is reported ``Failed`` and held
        until the request is withdrawn (the control plane removes the target first)."""
        if not request.quiesce or request.source_uid != pod.uid or \
                protocol.capture_report(pod, request.checkpoint_id) is None:
            return False
        try:
            handed = protocol.handoff_report(pod.annotations, request.checkpoint_id)
            lazy = protocol.capture_mode(pod.annotations, request.checkpoint_id) == \
                protocol.LAZY
        except ValueError:
            return False  # judged (and refused) as any malformed request
        if handed is None or lazy:
            return False
        self._finish((pod.uid, request.checkpoint_id), "orphaned")
        self._held[pod.uid] = request.checkpoint_id
        self.stats.failed += 1
        reason = (f"AgentRestarted: the agent on {self.node} restarted while checkpoint "
                  f"{request.checkpoint_id} was handed to another node, which may run it: "
                  "the workload stays stopped until the request is withdrawn")
        log.warning("an earlier incarnation of this agent handed this capture off and did "
                    "not finish it; holding the workload", pod=f"{pod.namespace}/{pod.name}",
                    checkpoint=request.checkpoint_id)
        self._spawn(self._report(pod, request.checkpoint_id, protocol.ReportState.FAILED,
                                 reason=reason), "orphaned handoff report")
        return True

    def _cancel_capture(self, uid: str, reason: str) -> None:
        running = self._captures.get(uid)
        # Once: the job's own unstick (report, release) must not be cancelled in its turn.
        if running is not None and running.task is not None and not running.task.done() \
                and not running.cancel_reason and not running.unsticking:
            running.cancel_reason = reason
            running.task.cancel()

    async def _capture(self, pod: PodView, request: CaptureRequest, record: _Capture) -> None:
        key = (pod.uid, request.checkpoint_id)
        workdir = self.settings.workdir / f"capture-{pod.uid}-{_safe(request.checkpoint_id)}"
        self.stats.captures += 1
        outcome = "failed"
        try:
            if record.previous is not None:  # its release must not undo this capture's freeze
                await asyncio.wait({record.previous})
            record.deadline = asyncio.get_running_loop().time() + self.settings.capture_timeout
            async with asyncio.timeout(self.settings.capture_timeout):
                digest = await self._capture_steps(pod, request, workdir, record)
            if not digest:  # lazy: nothing pushed, every page went to the target
                outcome = "transferred"
                self.stats.transferred += 1
                log.info("checkpoint transferred lazily", pod=f"{pod.namespace}/{pod.name}",
                         checkpoint=request.checkpoint_id, target=record.target)
                return
            outcome = "pushed"
            self.stats.pushed += 1
            log.info("checkpoint pushed", pod=f"{pod.namespace}/{pod.name}",
                     checkpoint=request.checkpoint_id, digest=digest)
        except asyncio.CancelledError:
            if not record.cancel_reason:  # the agent is stopping: the next one takes it over
                self._end_offer(record, "the source agent stopped")
                raise
            self._end_offer(record, record.cancel_reason)
            if record.pushed:  # Pushed stands; only the offer was still open
                outcome = "pushed"
                self.stats.pushed += 1
                self._held.pop(pod.uid, None)
                await self._release(pod)
            else:
                outcome = "cancelled"
                await self._unstick(pod, request, record.cancel_reason)
        except TimeoutError:
            if record.pushed:  # Pushed stands; the workload stays held if quiesced
                outcome = "pushed"
                self.stats.pushed += 1
                self._end_offer(record, f"Timeout: the capture deadline "
                                        f"({self.settings.capture_timeout:g}s) passed before "
                                        f"{record.target} fetched the checkpoint")
            else:
                record.unsticking = True
                reason = (f"Timeout: the capture did not finish within "
                          f"{self.settings.capture_timeout:g}s")
                handed = _at_target(record)
                self._end_offer(record, reason)
                await self._unstick(pod, request, reason, handed=handed)
        except (AgentError, RegistryError, KubeApiError, OSError) as exc:
            record.unsticking = True
            reason = exc.report() if isinstance(exc, AgentError) else \
                f"{type(exc).__name__}: {exc}"
            handed = _at_target(record)
            self._end_offer(record, reason)
            await self._unstick(pod, request, reason, handed=handed)
        finally:
            self._end_offer(record, "the capture job ended")
            if self._captures.get(pod.uid) is record:
                del self._captures[pod.uid]
            self._finish(key, outcome)
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _end_offer(self, record: _Capture, reason: str) -> None:
        """Withdraw the capture's offer with ``reason`` unless delivered (then: done)."""
        offer, record.offer = record.offer, None
        if offer is not None and self.handoff is not None:
            self.handoff.server.withdraw(offer.checkpoint_id, "delivered" if
                                         offer.is_delivered else reason)

    def _handoff_target(self, pod: PodView, request: CaptureRequest) -> str:
        """The node the capture is also handed to (``""``: none); refused before anything
        is frozen when malformed or when this agent has no handoff key."""
        try:
            target = protocol.capture_handoff(pod.annotations, request.checkpoint_id)
            if target:
                frames.check_name(target, what="the handoff's target node")
                frames.check_name(request.checkpoint_id, what="the checkpoint id")
        except ValueError as exc:
            raise RequestRefused(f"{exc}; nothing was frozen") from exc
        if target and self.handoff is None:
            raise RequestRefused(f"this agent has no --handoff-key: it cannot hand checkpoint "
                                 f"{request.checkpoint_id} to {target}; nothing was frozen "
                                 "(start the agents with --handoff-key FILE, their shared "
                                 "key, or capture without a handoff)")
        return target

    async def _capture_steps(self, pod: PodView, request: CaptureRequest,
                             workdir: Path, record: _Capture) -> str:
        ref = judge_capture(request, pod, node=self.node)
        try:  # before anything is frozen
            mode = protocol.capture_mode(pod.annotations, request.checkpoint_id)
        except ValueError as exc:
            raise RequestRefused(f"{exc}; nothing was frozen") from exc
        record.target = self._handoff_target(pod, request)
        workload = self._workload(pod)
        lazy = self._lazy(pod, request, mode, record.target)
        await check_mode(self.dumper, mode, node=self.node, workload=workload)
        recipients = await self._recipients(pod, request)  # before anything is frozen
        wanted = _containers(workload, request.containers)
        await asyncio.to_thread(workdir.mkdir, mode=0o700, parents=True, exist_ok=True)
        if self._slots.locked():
            await self._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                               reason="queued: waiting for a capture slot on this node")
        async with self._slots:
            if lazy is not None:
                await capture_lazily(self, pod, request, DumpRequest(
                    request.checkpoint_id, workload, wanted, request.quiesce, request.saver,
                    workdir), record, lazy)
                return ""
            return await self._dump_and_push(pod, request, workdir, ref, workload, wanted,
                                             recipients, record)

    def _lazy(self, pod: PodView, request: CaptureRequest, mode: str,
              target: str) -> LazyDumper | None:
        """The dumper's lazy capability when ``mode`` is lazy (``None`` otherwise); a lazy
        request this agent cannot serve is refused before anything is frozen."""
        if mode != protocol.LAZY:
            return None
        if not target:
            raise RequestRefused(f"mode {mode!r} hands the workload to another node's agent: "
                                 f"the request needs {protocol.CAPTURE_HANDOFF} naming the "
                                 "target node; nothing was frozen")
        seal = read_seal(pod.annotations, request.checkpoint_id)
        if seal is not None and seal.required:
            raise RequestRefused(f"mode {mode!r} sends the memory from CRIU's page server "
                                 "unencrypted, and this checkpoint must be sealed; nothing "
                                 "was frozen")
        lazy = lazy_dumper(self.dumper)
        if lazy is None and getattr(self.dumper, "refuse_mode", None) is not None:
            raise RequestRefused(f"the {self.dumper.name} dumper cannot hand a workload over "
                                 "lazily; nothing was frozen")
        return lazy  # None: check_mode refuses, naming the dumper

    async def _recipients(self, pod: PodView, request: CaptureRequest) -> list[Any] | None:
        """The keys to seal for (``None``: plain); a required seal that cannot be had is
        refused here, before the dump, and never falls back to plain text."""
        seal = read_seal(pod.annotations, request.checkpoint_id)
        if seal is None:
            return None
        try:
            return await asyncio.to_thread(self.sealing.recipients, seal)  # reads key files
        except RequestRefused:
            if seal.required:
                raise
            log.warning("sealing is not required and its recipients cannot be had: pushing "
                        "plain layers", pod=f"{pod.namespace}/{pod.name}",
                        checkpoint=request.checkpoint_id)
            return None

    async def _dump_and_push(self, pod: PodView, request: CaptureRequest, workdir: Path,
                             ref: ArtifactRef, workload: Workload,
                             wanted: tuple[Container, ...],
                             recipients: list[Any] | None, record: _Capture) -> str:
        await self._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                           reason=f"dumping {', '.join(c.name for c in wanted)} with the "
                                  f"{self.dumper.name} dumper")
        result = await self.dumper.dump(DumpRequest(
            request.checkpoint_id, workload, wanted, request.quiesce, request.saver, workdir))
        if request.quiesce:
            self._held[pod.uid] = request.checkpoint_id
        else:
            await self.dumper.release(self._workload(pod))
        prov = Provenance(checkpoint_id=request.checkpoint_id, source_uid=pod.uid,
                          node=self.node, namespace=pod.namespace, pod=pod.name,
                          format=result.format, dumper=self.dumper.name,
                          created=self.clock.now(), engine=result.engine)

        if not record.target:
            pushed, how = await self._push(pod, request, ref, result.archives, prov,
                                           recipients, target="")
        else:
            pushed, how = await self._push_and_offer(pod, request, ref, result.archives,
                                                     prov, recipients, record)
        record.pushed = record.offer is not None  # from here on, Pushed stands
        await self._report(pod, request.checkpoint_id, protocol.ReportState.PUSHED,
                           digest=pushed.digest,
                           reason=f"pushed {len(result.archives)} archive(s), "
                                  f"{pushed.archive_bytes} bytes ({how}), to {ref}")
        if record.offer is not None:
            # The offer stays until the target has it, the request is withdrawn or the
            # capture's deadline passes (the archives are removed with the job).
            delivery = await record.offer.delivered()
            log.info("checkpoint handed off", pod=f"{pod.namespace}/{pod.name}",
                     checkpoint=request.checkpoint_id, target=record.target,
                     seconds=round(delivery.seconds, 3))
        return pushed.digest

    async def _push_and_offer(self, pod: PodView, request: CaptureRequest, ref: ArtifactRef,
                              archives: tuple[Archive, ...], prov: Provenance,
                              recipients: list[Any] | None,
                              record: _Capture) -> tuple[Pushed, str]:
        """The push and the offer side by side: neither waits for the other. The
        ``report-handoff`` is written as soon as the offer is made."""
        assert self.handoff is not None
        push = asyncio.ensure_future(self._push(pod, request, ref, archives, prov, recipients,
                                                target=record.target))
        try:
            try:
                record.offer, report = await self.handoff.offer(
                    request.checkpoint_id, archives, source_uid=pod.uid,
                    target_node=record.target, format=prov.format)
            except ValueError as exc:  # a container name the stream cannot carry
                raise HandoffUnavailable(f"checkpoint {request.checkpoint_id} cannot be "
                                         f"offered: {exc}") from exc
            await self.patcher.annotate(pod.namespace, pod.name, pod.uid, report.annotation())
            return await push
        finally:
            if not push.done():
                push.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await push

    async def _push(self, pod: PodView, request: CaptureRequest, ref: ArtifactRef,
                    archives_in: tuple[Archive, ...], prov: Provenance,
                    recipients: list[Any] | None, *, target: str) -> tuple[Pushed, str]:
        """Seal (if asked), sign (if a key) and push; the pushed artifact and how."""
        async def progress(stage: str) -> None:
            await self._report(pod, request.checkpoint_id, protocol.ReportState.CAPTURING,
                               reason=stage)

        assert ref.tag is not None
        archives, sealed_for = list(archives_in), []
        if recipients is not None:
            await progress(f"sealing {len(archives)} archive(s) for {len(recipients)} "
                           "recipient(s)")
            archives = await self.sealing.seal_archives(archives, recipients,
                                                        keep_plain=bool(target))
            sealed_for = self.sealing.key_ids(recipients)
        sign = (functools.partial(self.sealing.sign, self.registry, ref.repo)
                if self.sealing.signer is not None else None)
        pushed = await push_checkpoint(self.registry, ref.repo, ref.tag, archives, prov,
                                       progress=progress, sealed_for=sealed_for, sign=sign,
                                       archive_digests=bool(target))
        how = (f"sealed for {', '.join(sealed_for)}" if sealed_for else "plain") + \
            (", signed" if sign is not None else "") + \
            (f", also handed to {target}" if target else "")
        return pushed, how

    async def _unstick(self, pod: PodView, request: CaptureRequest, reason: str, *,
                       handed: bool = False) -> None:
        """Report the failure and let the workload run again (never left stopped) — unless
        it was ``handed`` to a target that may run it: a quiesced workload then stays held
        until the request is withdrawn (the control plane removes the target first)."""
        self.stats.failed += 1
        if handed and request.quiesce:
            self._held[pod.uid] = request.checkpoint_id
            log.warning("capture failed after it was offered to its target; the workload "
                        "stays held until the request is withdrawn",
                        pod=f"{pod.namespace}/{pod.name}", checkpoint=request.checkpoint_id,
                        reason=reason)
            with contextlib.suppress(Exception):
                await self._report(pod, request.checkpoint_id, protocol.ReportState.FAILED,
                                   reason=f"{reason} (handed to another node, which may run "
                                          "it: the workload stays stopped until the request "
                                          "is withdrawn)")
            return
        self._held.pop(pod.uid, None)
        log.warning("capture failed; releasing the workload", pod=f"{pod.namespace}/{pod.name}",
                    checkpoint=request.checkpoint_id, reason=reason)
        with contextlib.suppress(Exception):
            await self._report(pod, request.checkpoint_id, protocol.ReportState.FAILED,
                               reason=reason)
        await self._release(pod)

    async def _release(self, pod: PodView) -> None:
        try:
            await self.dumper.release(self._workload(pod))
        except Exception as exc:  # the report already says what failed; keep serving
            log.error("could not release the workload", pod=f"{pod.namespace}/{pod.name}",
                      error=repr(exc))

    async def _report(self, pod: PodView, checkpoint_id: str, state: protocol.ReportState,
                      *, reason: str = "", digest: str = "") -> None:
        self.stats.reports.append((f"{pod.namespace}/{pod.name}", state.value, reason))
        await self.patcher.annotate(pod.namespace, pod.name, pod.uid, {
            protocol.REPORT_CHECKPOINT_ID: checkpoint_id, protocol.REPORT_STATE: state.value,
            protocol.REPORT_DIGEST: digest, protocol.REPORT_REASON: reason[:1024]})

    def _finish(self, key: tuple[str, str], how: str) -> None:
        self._finished[key] = how
        while len(self._finished) > REMEMBERED:
            self._finished.popitem(last=False)

    # --- restore -------------------------------------------------------------------------

    def _reconcile_restore(self, pod: PodView) -> None:
        if pod.uid not in self._restoring and pod.uid not in self._restored and \
                restore_done(pod) and (left := unjudged(pod)) is not None:
            # Restored by an earlier agent of this node: lazily, with pages unseen?
            self._restored[pod.uid] = "restored"
            self._spawn(pages_unjudged(self, pod, left), f"pages of {pod.namespace}/{pod.name}")
            return
        # In memory: a job's own patch may arrive after other changes of the pod.
        if pod.uid in self._restoring or pod.uid in self._restored or restore_done(pod) or (
                protocol.RESTORE_ARTIFACT not in pod.annotations and
                protocol.RESTORE_HANDOFF not in pod.annotations):
            return
        task = self._spawn(self._restore(pod), f"restore {pod.namespace}/{pod.name}")
        self._restoring[pod.uid] = task
        created = _created(self._pods.get(pod.uid))
        if created is not None:
            self.stats.restore_delays.append(
                max(0.0, (self.clock.now() - created).total_seconds()))

    async def _restore(self, pod: PodView) -> None:
        workdir = self.settings.workdir / f"restore-{pod.uid}"
        self.stats.restores += 1
        try:
            async with asyncio.timeout(self.settings.restore_timeout):
                marks = await self._restore_steps(pod, workdir)
            await self.patcher.annotate(pod.namespace, pod.name, pod.uid, marks)
            self._restored[pod.uid] = "restored"
            log.info("pod restored", pod=f"{pod.namespace}/{pod.name}",
                     digest=marks.get(protocol.RESTORED_FROM_DIGEST),
                     handoff=marks.get(protocol.RESTORED_FROM_HANDOFF))
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            stage = self._restore_stage.get(pod.uid)
            await self._restore_failed(pod, f"Timeout: the restore did not finish within "
                                            f"{self.settings.restore_timeout:g}s" +
                                            (f" ({stage})" if stage else ""))
        except HandoffFailed as exc:
            await self._restore_failed(pod, f"{type(exc).__name__}: {exc.reason}")
        except (AgentError, RegistryError, KubeApiError, OSError) as exc:
            await self._restore_failed(pod, exc.report() if isinstance(exc, AgentError)
                                       else f"{type(exc).__name__}: {exc}")
        finally:
            lazy = self._receiving.pop(pod.uid, None)
            if lazy is not None:  # the container runs: its pages arrive after the marks
                self._spawn(pages_arrive(self, pod, *lazy),
                            f"pages of {pod.namespace}/{pod.name}")
            self._restore_stage.pop(pod.uid, None)
            self._restoring.pop(pod.uid, None)
            self._changed.pop(pod.uid, None)
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _restore_steps(self, pod: PodView, workdir: Path) -> dict[str, str | None]:
        if protocol.RESTORE_HANDOFF in pod.annotations:
            if protocol.RESTORE_ARTIFACT in pod.annotations:
                raise RequestRefused(f"the pod carries both {protocol.RESTORE_ARTIFACT} and "
                                     f"{protocol.RESTORE_HANDOFF}: ambiguous; the control "
                                     "plane asks for one of them")
            return await self._restore_from_handoff(pod, workdir)
        request = restore_request(pod)
        assert request is not None
        assert request.artifact.digest is not None
        digest = request.artifact.digest
        await self.sealing.verify(self.registry, request.artifact.repo, digest)
        if getattr(self.dumper, "runtime_restores", False):
            # The runtime pulls the checkpoint images itself: read the manifest only.
            manifest = await self.registry.get_manifest(request.artifact.repo, digest)
            artifact, files = read_checkpoint_manifest(manifest.body), {}
        else:
            pulled = await pull_checkpoint(self.registry, request.artifact.repo, digest,
                                           workdir, unseal=self.sealing.unsealer(request.unseal))
            artifact, files = pulled.artifact, pulled.files
        named = artifact.checkpoint_id
        if request.checkpoint_id and named != request.checkpoint_id:
            raise RestoreFailed(f"artifact {request.artifact} is checkpoint {named!r}, not "
                                f"{request.checkpoint_id!r}")
        result = await self.dumper.restore(RestoreRequest(
            self._workload(pod), digest, artifact, files, request.loader,
            latest=functools.partial(self._latest, pod.uid)))
        marks: dict[str, str | None] = dict(result.annotations)
        marks.update({protocol.RESTORED_FROM_DIGEST: digest,
                      protocol.INSTANCE_ID: f"{pod.uid}.{new_id()[:8]}",
                      protocol.RESTORE_FAILURE: None})
        return marks

    async def _restore_from_handoff(self, pod: PodView,
                                    workdir: Path) -> dict[str, str | None]:
        """Restore from the source agent's stream (``restore-handoff``)."""
        try:
            request = protocol.restore_handoff(pod.annotations)
        except ValueError as exc:
            raise RequestRefused(str(exc)) from exc
        assert request is not None
        source = f"{request.namespace}/{request.name}"
        if self.handoff is None:
            raise RequestRefused(f"this agent has no --handoff-key: it cannot receive "
                                 f"checkpoint {request.checkpoint_id} from {source} (start "
                                 "the agents with --handoff-key FILE, their shared key)")
        runtime_restores = getattr(self.dumper, "runtime_restores", False)
        if runtime_restores and lazy_dumper(self.dumper) is None:
            raise RestoreUnsupported(f"the {self.dumper.name} dumper's runtime restores from "
                                     "the registry's checkpoint images, not from a handoff")
        self._restore_stage[pod.uid] = (f"waiting for {source} to offer checkpoint "
                                        f"{request.checkpoint_id} in "
                                        f"{protocol.REPORT_HANDOFF}, then fetching it")
        received, report = await self.handoff.fetch(
            self.patcher.api, request, node=self.node, dest=workdir / "handoff",
            within=self.settings.restore_timeout)
        self._restore_stage[pod.uid] = f"restoring checkpoint {request.checkpoint_id}"
        digests = {a.container: a.digest for a in received.archives}
        restore = RestoreRequest(
            self._workload(pod), "", _received_artifact(received, request.source_uid),
            received.paths, pod.annotations.get(protocol.RESTORE_LOADER, ""),
            latest=functools.partial(self._latest, pod.uid))
        marks: dict[str, str | None] = {}
        if runtime_restores and not report.pages:
            raise RestoreUnsupported(f"the {self.dumper.name} dumper's runtime restores a "
                                     "handoff only lazily (its checkpoint image has no memory)")
        if report.pages:
            lazy = lazy_dumper(self.dumper)
            if lazy is None:
                raise RestoreUnsupported(f"{source} hands checkpoint {request.checkpoint_id} "
                                         f"over lazily, which the {self.dumper.name} dumper "
                                         "cannot restore")
            pages_dir = self.settings.workdir / f"lazy-{pod.uid}"
            try:
                receiving = await lazy.restore_lazy(
                    restore, pages=protocol.host_port(report.pages), workdir=pages_dir)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, pages_dir, True)
                raise
            self._receiving[pod.uid] = (request.checkpoint_id, receiving, pages_dir)
        else:
            marks.update((await self.dumper.restore(restore)).annotations)
        marks.update(protocol.restored_from_handoff(request.checkpoint_id, digests))
        marks.update({protocol.INSTANCE_ID: f"{pod.uid}.{new_id()[:8]}",
                      protocol.RESTORE_FAILURE: None})
        return marks

    async def _latest(self, uid: str, within: float) -> KubeObject | None:
        """The pod ``uid`` after its next change, or as it is after ``within`` seconds."""
        changed = self._changed.setdefault(uid, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await changed.wait()
        changed.clear()
        return self._pods.get(uid)

    async def _restore_failed(self, pod: PodView, reason: str) -> None:
        self.stats.restore_failures += 1
        self._restored[pod.uid] = "failed"
        log.warning("restore failed", pod=f"{pod.namespace}/{pod.name}", reason=reason)
        with contextlib.suppress(Exception):
            await self.patcher.annotate(pod.namespace, pod.name, pod.uid,
                                        {protocol.RESTORE_FAILURE: reason[:1024]})

    # --- plumbing ------------------------------------------------------------------------

    def _workload(self, pod: PodView) -> Workload:
        """The pod as last seen (annotations may have moved on since ``pod`` was read)."""
        obj = self._pods.get(pod.uid)
        latest = pod_view(obj) if obj is not None else pod
        spec = (obj or {}).get("spec") or {}
        statuses = {str(s.get("name")): s for s in
                    ((obj or {}).get("status") or {}).get("containerStatuses") or []
                    if isinstance(s, dict)}
        containers = tuple(
            Container(str(c.get("name")), str(c.get("image") or ""),
                      str((statuses.get(str(c.get("name"))) or {}).get("containerID") or ""),
                      str((statuses.get(str(c.get("name"))) or {}).get("imageID") or ""))
            for c in spec.get("containers") or [] if isinstance(c, dict))
        return Workload(latest.namespace, latest.name, latest.uid, self.node, containers,
                        dict(latest.annotations))

    def _spawn(self, work: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent job failed", job=task.get_name(), error=repr(task.exception()))
        if not self._tasks:
            self._idle.set()

    async def idle(self) -> None:
        """Until no job runs (tests; a graceful stop)."""
        await self._idle.wait()

    async def stop(self) -> None:
        """Cancel every job (requests stay on the pods for the next agent to take)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


#: The job directories an agent makes in its work directory: nothing else is removed.
_JOB_DIRS = ("capture-", "restore-", "lazy-")


def prepare_workdir(workdir: Path) -> int:
    """Make the work directory private (0700) and remove what a killed agent left there.

    Every job directory holds a dump in plain text (each process's memory) until the job
    ends and removes it; an agent killed mid-job cannot, so the next one does at start,
    before it serves anything. Returns how many job directories it removed.
    """
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    workdir.chmod(0o700)
    removed = 0
    for entry in workdir.iterdir():
        if entry.name.startswith(_JOB_DIRS) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _received_artifact(received: Received, source_uid: str) -> CheckpointArtifact:
    """What a dumper reads of an artifact, from a handoff stream's HEAD (the format travels
    in it) instead of a manifest."""
    return CheckpointArtifact(
        {protocol.MANIFEST_CHECKPOINT_ID: received.checkpoint_id,
         protocol.MANIFEST_SOURCE_POD_UID: source_uid,
         protocol.MANIFEST_FORMAT: received.format},
        tuple(Layer(a.container, Descriptor(a.media_type, a.digest, a.size,
                                            dict(a.annotations)), a.image, a.diff_id)
              for a in received.archives))


def _uid(obj: KubeObject | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _created(obj: KubeObject | None) -> datetime | None:
    stamp = ((obj or {}).get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(stamp)) if stamp else None
    except ValueError:
        return None


def _at_target(record: _Capture) -> bool:
    """Whether the capture's target may hold it whole, and so run it: a quiesced workload
    is then never woken by the agent's own failure, only by a withdrawal (the control
    plane removes the target first). An offer not yet fetched is withdrawn before the
    release, so no target can have it."""
    return record.offer is not None and record.offer.may_have_reached_target


def _reported(pod: PodView) -> protocol.ReportState | None:
    try:
        return protocol.ReportState(pod.annotations.get(protocol.REPORT_STATE, ""))
    except ValueError:
        return None


def _containers(workload: Workload, names: tuple[str, ...]) -> tuple[Container, ...]:
    if not names:
        if not workload.containers:
            raise RequestRefused(f"pod {workload.key} has no containers to capture")
        return workload.containers
    known: Mapping[str, Container] = {c.name: c for c in workload.containers}
    missing = [n for n in names if n not in known]
    if missing:
        raise RequestRefused(f"pod {workload.key} has no container(s) {', '.join(missing)}")
    return tuple(known[n] for n in names)


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:80]
