"""The front door's loop: watch the resources, create their operations, mirror status.

For every resource of the operation kinds (``requests.RESOURCES``) the door keeps
the newest copy it saw, fed by ``ResourceApi.informer`` (over the API server: the
driver's watch cache, with its bookmarks, resume, backoff and relist after a 410), and
reconciles it, taking keys from a rate-limited work queue (:mod:`.workqueue`: a key is
never reconciled by two passes at once, a change during a pass queues it once after):

1. **Deleted** (``deletionTimestamp``): cancel its live operations; once they are
   settled (or never existed) remove the finalizer. The history stays: deleting a
   resource never deletes an operation's events.
2. **New**: add the finalizer (a merge patch carrying ``resourceVersion``: a stale copy
   gets a 409 and is read again), build the operation's spec from the resource
   (``requests.ask_of``) and submit it under the resource's UID. ``MachineExists`` means
   another worker, or this one before a restart, already did: nothing is created twice.
   A refusal is written as ``Accepted=False`` with its reason and message; only a busy
   workload, an unreachable cluster, or a Restore whose Checkpoint has not finished (or
   not been seen) is tried again (``RETRIED``). A 409 on a write means the copy was
   stale: the key is tried again once the watch has brought the newer one, so the door
   needs no GET of the resources.
3. **Known**: ``spec.cancel`` sends Cancel, a changed ``Migration.spec.targetNodeName``
   sends Retarget, a ``Suspension`` with ``operatingMode: Running`` submits its resume
   once the suspension settled. Commands are idempotent in the machines (a second Cancel
   appends nothing).
4. **Mirror**: the status the resource should have (``status.desired_status``) is written
   through the status subresource when it differs from what the server holds, so a lost
   or edited status is rewritten at the next pass, at most once per
   ``status_interval`` per resource. The mirror polls the store every ``mirror_seconds``
   (one query for the operations' versions) and reconciles every resource whose status
   is not yet written from its operations' current versions (``_Memo.mirrored``): they
   moved, the last pass failed or was rate-limited, or it found an operation ended but
   not settled. A resource with a pass already due (``_later``) is left to that pass.

A failed pass (API server, database, a bug) is logged and its key queued again after a
backoff of its own (``retry_seconds``, doubling up to ``retry_max_seconds``, reset by a
pass that succeeds); the loop itself never dies of one.

Faults are injected, never read from the environment: the composition root passes
``faults`` (``ports.NO_FAULTS`` in production); a test starts the worker through
``tests/support/faulty_cpctl.py`` to SIGKILL it at ``frontdoor.submitted``, right after
an operation is created and before the resource's status is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controlplane.app.operations import send_command
from controlplane.app.ports import ClusterAccess
from controlplane.app.requests import submit
from controlplane.app.waiting import settled
from controlplane.clock import Clock
from controlplane.engine.commands import Command
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import ControlPlaneError, UsageError
from controlplane.frontdoor.ports import NO_FAULTS, Faults, Resource, ResourceApi, StaleResource
from controlplane.frontdoor.requests import (
    OPERATION_KINDS,
    ClassSource,
    ask_of,
    operation_id,
    resume_ask,
    resume_id,
    wants_cancel,
    wants_resume,
)
from controlplane.frontdoor.status import Refusal, desired_status, rfc3339, status_patch
from controlplane.frontdoor.workqueue import ShutDown, WorkQueue
from controlplane.machines.base.commands import Cancel, Retarget
from controlplane.machines.submission import Limits
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import MachineExists, MachineNotFound, WorkloadBusy
from controlplane.store.records import MachineRecord

log = logging.getLogger(__name__)

FINALIZER = "checkpoint.controlplane.dev/operation"
#: The requester recorded on operations the front door submits and commands it sends.
REQUESTER = "frontdoor"
#: Refusal reasons tried again at every resync: the world may change under them.
RETRIED = frozenset({"WorkloadBusy", "ClusterUnavailable", "CheckpointNotFound",
                     "WaitingForCheckpoint"})
Key = tuple[str, str | None, str]  # kind, namespace, name
#: The fault point right after the door created an operation, before it wrote the
#: resource's status (``detail``: the operation id): the crash test's window.
SUBMITTED = "frontdoor.submitted"


@dataclass(frozen=True)
class DoorSettings:
    #: How often to look for the CRDs until they are served, and to try again a
    #: submission refused for a reason the world may change (``RETRIED``).
    resync_seconds: float = 30.0
    mirror_seconds: float = 1.0
    status_interval: float = 1.0
    #: A failed pass's key backs off from ``retry_seconds``, doubling up to the max.
    retry_seconds: float = 2.0
    retry_max_seconds: float = 60.0
    #: How often a Restore waiting for its Checkpoint looks again.
    wait_seconds: float = 5.0
    #: Passes run at once (over different keys: the queue never hands out one twice).
    workers: int = 1


def key_of(resource: Mapping[str, Any]) -> Key:
    meta = resource.get("metadata") or {}
    return (str(resource.get("kind")), meta.get("namespace"), str(meta.get("name")))


@dataclass
class _Memo:
    """What the door remembers of one resource between passes (lost on restart: every
    item is re-derived from the resource and the store)."""

    refusal: Refusal | None = None
    #: The machine's answer to the last command it refused (Cancel past the point of no
    #: return, Retarget of an ending migration), shown as ``CommandRefused`` until one is
    #: accepted or the operation settles.
    command_refused: Refusal | None = None
    status_written_at: float = 0.0
    #: Each of the resource's operations (a Suspension's resume too) at the version the
    #: status was last written (or found right) from: the mirror reconciles the resource
    #: until this holds every current version. Only a pass that wrote sets it, so a
    #: failed or deferred write is tried again. An operation that ended but still holds
    #: its lease or owes actions is left out: it settles (the worker's release, a commit
    #: of its own) without a new version, and only then is it Succeeded or Failed.
    mirrored: dict[str, int] = field(default_factory=dict)


class FrontDoor:
    """Custom resources in, operations and status out (see the module docstring)."""

    def __init__(self, db: Database, kinds: KindRegistry, access: ClusterAccess,
                 api: ResourceApi, classes: ClassSource, clock: Clock, *,
                 limits: Limits | None = None, settings: DoorSettings | None = None,
                 faults: Faults = NO_FAULTS) -> None:
        self.db = db
        self.kinds = kinds
        self.access = access
        self.api = api
        self.classes = classes
        self.clock = clock
        self.limits = limits
        self.settings = settings or DoorSettings()
        self.faults = faults
        self.seen: dict[Key, Resource] = {}
        self.memo: dict[Key, _Memo] = {}
        self.queue = self._new_queue()
        self._stopping = asyncio.Event()

    def _new_queue(self) -> WorkQueue[Key]:
        return WorkQueue(base_delay=self.settings.retry_seconds,
                         max_delay=self.settings.retry_max_seconds)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Until :meth:`stop`: wait for the CRDs, then watch, reconcile and mirror."""
        announced = False
        while not await self._served():
            if not announced:
                log.info("front door idle: the API server does not serve "
                         "checkpoint.controlplane.dev (install the CRDs from deploy/); "
                         "checking every %ss", self.settings.resync_seconds)
                announced = True
            if await self._wait(self.settings.resync_seconds):
                return
        log.info("front door open: watching %s", ", ".join(OPERATION_KINDS))
        if self.queue.shut:  # run again after a stop
            self.queue = self._new_queue()
        async with contextlib.AsyncExitStack() as informers:
            for kind in OPERATION_KINDS:
                await informers.enter_async_context(
                    self.api.informer(kind, functools.partial(self._changed, kind)))
            tasks = [asyncio.create_task(self._reconciler())
                     for _ in range(max(1, self.settings.workers))]
            tasks.append(asyncio.create_task(self._mirror()))
            try:
                await self._stopping.wait()
            finally:
                self.queue.shut_down()
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _served(self) -> bool:
        try:
            return await self.api.served()
        except ControlPlaneError as exc:
            log.warning("front door: cannot ask the API server for the CRDs: %s", exc)
            return False

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until stopped; ``True`` if stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._stopping.is_set()

    # -- watching -------------------------------------------------------------------------

    def _changed(self, kind: str, old: Resource | None, new: Resource | None) -> None:
        """The informer's news: keep the newest copy and reconcile it, or forget it."""
        if new is None:
            if old is not None:
                key = key_of({**old, "kind": kind})
                held = self.seen.get(key)
                # The deletion of a resource already replaced by a namesake (a watch that
                # saw both, in either order) must not forget the namesake.
                if held is None or _uid(held) in ("", _uid(old)):
                    self._forget(key)
            return
        self._saw(new if new.get("kind") else {**new, "kind": kind})

    def _saw(self, obj: Resource) -> None:
        """Keep ``obj`` as the key's newest copy and reconcile it. The informer reports
        only changes (a relist's unchanged resources are not news: their operations'
        moves reach them through the mirror's poll), so a resync costs nothing per
        settled resource."""
        key = key_of(obj)
        self.seen[key] = obj
        self.queue.add(key)

    def _forget(self, key: Key) -> None:
        self.seen.pop(key, None)
        self.memo.pop(key, None)
        self.queue.drop(key)

    def _later(self, key: Key, seconds: float) -> None:
        """Reconcile ``key`` in ``seconds``, or sooner if a pass is due sooner: one timer
        a key (a timer per pass asking would multiply with every watch event)."""
        self.queue.add_after(key, seconds)

    async def _patch(self, key: Key, patch: Resource, *, status: bool = False) -> Resource:
        """``api.patch``; its answer becomes the key's copy unless the watch brought one
        while the write was in flight: that copy may be newer than the answer (an edit
        right after the write), and a pass that kept the answer would write nothing. A
        copy brought before the write went out is older than the answer, which is kept."""
        sent_over = self.seen.get(key)
        answer = await self.api.patch(key[0], key[1], key[2], patch, status=status)
        answer.setdefault("kind", key[0])
        if key in self.seen and self.seen[key] is sent_over:
            self.seen[key] = answer
        return answer

    # -- the mirror's poll ------------------------------------------------------------------

    async def _mirror(self) -> None:
        """Reconcile every resource whose status is not written from its operations'
        current versions (``_Memo.mirrored``), unless a pass is due for it already."""
        while True:
            await asyncio.sleep(self.settings.mirror_seconds)
            owners: dict[str, Key] = {}
            for key, obj in list(self.seen.items()):
                owners[operation_id(obj)] = key
                if key[0] == "Suspension":
                    owners[resume_id(obj)] = key
            try:
                versions = await queries.machine_versions(self.db, list(owners))
            except ControlPlaneError as exc:
                log.warning("front door: cannot read the operations' versions: %s", exc)
                continue
            except Exception:  # a task that died here would stop mirroring for good
                log.exception("front door: reading the operations' versions failed")
                continue
            for machine_id, version in versions.items():
                key = owners[machine_id]
                memo = self.memo.get(key)
                if not self.queue.scheduled(key) and (
                        memo is None or memo.mirrored.get(machine_id) != version):
                    self.queue.add(key)

    # -- reconciling ------------------------------------------------------------------------

    async def _reconciler(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self._pass(key)
            finally:
                self.queue.done(key)

    async def _pass(self, key: Key) -> None:
        """Reconcile the key's newest copy; a failure backs the key off, a success
        forgets its failures."""
        obj = self.seen.get(key)
        if obj is None:
            return
        try:
            await self.reconcile(obj)
        except StaleResource:  # the watch brings the newer copy (or its deletion)
            self.queue.add_rate_limited(key)
        except ControlPlaneError as exc:
            delay = self.queue.add_rate_limited(key)
            log.warning("front door: %s %s/%s: %s; trying again in %ss", key[0],
                        key[1] or "-", key[2], exc, delay)
        except Exception:  # one resource's bug must not stop the others
            delay = self.queue.add_rate_limited(key)
            log.exception("front door: reconciling %s %s/%s failed; trying again in %ss",
                          *key, delay)
        else:
            self.queue.forget(key)

    async def _machine(self, machine_id: str) -> MachineRecord | None:
        try:
            return await queries.get_machine(self.db, machine_id)
        except MachineNotFound:
            return None

    async def reconcile(self, obj: Resource) -> None:
        """One pass over one resource (see the module docstring); idempotent."""
        key = key_of(obj)
        memo = self.memo.setdefault(key, _Memo())
        operation = await self._machine(operation_id(obj))
        resume = await self._machine(resume_id(obj)) if key[0] == "Suspension" else None
        live = [r for r in (operation, resume) if r is not None and not settled(r)]
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            for record in live:
                await self._command(record, Cancel(), memo)
            if not live:
                await self._release(obj)
                _mirrored(memo, operation, resume)
                return
        elif operation is None:
            prior = _refused_before(obj)
            if wants_cancel(obj):
                memo.refusal = Refusal("Cancelled", "cancelled before its operation started")
            elif prior is not None and prior.reason not in RETRIED:
                memo.refusal = prior  # refused for this generation: final, even after a restart
            else:
                obj = await self._hold(obj)
                memo.refusal = await self._submit(obj)
                operation = await self._machine(operation_id(obj))
        else:
            await self._follow(obj, operation, resume, memo)
            resume = await self._machine(resume_id(obj)) if key[0] == "Suspension" else None
        if await self._write_status(key, obj, operation, resume, memo):
            _mirrored(memo, operation, resume)

    async def _submit(self, obj: Resource) -> Refusal | None:
        """Submit the resource's operation; the refusal to show, if it was refused."""
        checkpoint_ids, waiting = await self._restore_source(obj)
        if waiting is not None:
            self._later(key_of(obj), self.settings.wait_seconds)
            return waiting
        try:
            ask = await ask_of(obj, db=self.db, access=self.access, classes=self.classes,
                               checkpoint_ids=checkpoint_ids)
            await submit(self.db, self.kinds, ask.prepared, machine_id=ask.machine_id,
                         now=self.clock.now(), limits=self.limits, requester=REQUESTER)
        except MachineExists:
            return None  # another worker (or this one, before a restart) submitted it
        except WorkloadBusy as exc:
            self._later(key_of(obj), self.settings.resync_seconds)
            return Refusal("WorkloadBusy", str(exc))
        except UsageError as exc:
            return Refusal("InvalidSpec", _one_line(exc))
        except ControlPlaneError as exc:
            self._later(key_of(obj), self.settings.resync_seconds)
            return Refusal("ClusterUnavailable", _one_line(exc))
        self.faults.reached(SUBMITTED, ask.machine_id)
        return None

    async def _restore_source(self, obj: Resource) -> tuple[dict[str, str], Refusal | None]:
        """A Restore's ``spec.checkpointName`` -> the operation id of the Checkpoint (or
        Suspension) of that name in its namespace, read from the door's own watch (no
        GET); or why it must wait: that resource not seen yet, or its operation not
        settled (a Checkpoint and its Restore applied together). Other kinds: nothing."""
        spec = obj.get("spec") or {}
        name = spec.get("checkpointName") if obj.get("kind") == "Restore" else None
        if not isinstance(name, str) or not name:
            return {}, None
        namespace = (obj.get("metadata") or {}).get("namespace")
        found = self.seen.get(("Checkpoint", namespace, name)) or self.seen.get(
            ("Suspension", namespace, name))
        if found is None:
            return {}, Refusal("CheckpointNotFound",
                               f"spec.checkpointName {name!r}: no Checkpoint or Suspension of "
                               f"that name in namespace {namespace} (yet); waiting for it")
        source = await self._machine(operation_id(found))
        if source is None or not settled(source):
            return {}, Refusal("WaitingForCheckpoint",
                               f"spec.checkpointName {name!r}: its checkpoint has not "
                               "finished; the restore starts once it has")
        return {name: operation_id(found)}, None

    async def _follow(self, obj: Resource, operation: MachineRecord,
                      resume: MachineRecord | None, memo: _Memo) -> None:
        """Commands the resource's spec asks of its running operation(s)."""
        if wants_cancel(obj):
            for record in (operation, resume):
                if record is not None and not record.terminal:
                    await self._command(record, Cancel(), memo)
            return
        spec = obj.get("spec") or {}
        if obj.get("kind") == "Migration" and not operation.terminal:
            target = spec.get("targetNodeName")
            if isinstance(target, str) and target and target != operation.state.get("target"):
                await self._command(operation, Retarget(node=target), memo)
        if wants_resume(obj) and resume is None and settled(operation):
            if operation.phase != "Suspended":
                return  # nothing to resume: the status says how the suspension ended
            key = key_of(obj)
            try:
                ask = await resume_ask(obj, db=self.db, access=self.access)
                await submit(self.db, self.kinds, ask.prepared, machine_id=ask.machine_id,
                             now=self.clock.now(), limits=self.limits, requester=REQUESTER)
            except MachineExists:
                memo.command_refused = None
            except WorkloadBusy as exc:
                log.info("front door: resume of %s/%s waits: %s", key[1], key[2], exc)
                self._later(key, self.settings.resync_seconds)
            except UsageError as exc:  # shown as CommandRefused beside the suspension's outcome
                log.warning("front door: resume of %s/%s refused: %s", key[1], key[2],
                            _one_line(exc))
                memo.command_refused = Refusal("ResumeRefused", _one_line(exc))
            else:
                memo.command_refused = None

    async def _command(self, record: MachineRecord, command: Command, memo: _Memo) -> None:
        """Send ``command``; a refusal (the machine says why) is kept to show on the status."""
        try:
            await send_command(self.db, self.kinds, machine_id=record.id, command=command,
                               now=self.clock.now(), requester=REQUESTER)
        except UsageError as exc:
            log.info("front door: %s of %s refused: %s", command.type, record.id, exc)
            memo.command_refused = Refusal(f"{command.type}Refused", _one_line(exc))
        else:
            memo.command_refused = None

    async def _hold(self, obj: Resource) -> Resource:
        """The resource with the finalizer added (so a delete waits for the operation)."""
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER in finalizers:
            return obj
        return await self._patch(key_of(obj), {"metadata": {
            "finalizers": [*finalizers, FINALIZER],
            "resourceVersion": meta.get("resourceVersion")}})

    async def _release(self, obj: Resource) -> None:
        """Remove the finalizer: the operation is settled (or never was), the delete goes on."""
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        await self.api.patch(
            str(obj["kind"]), meta.get("namespace"), str(meta["name"]),
            {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER],
                          "resourceVersion": meta.get("resourceVersion")}})

    async def _write_status(self, key: Key, obj: Resource, operation: MachineRecord | None,
                            resume: MachineRecord | None, memo: _Memo) -> bool:
        """Bring the server's status to the one these records give; ``False``: deferred
        (rate-limited, due again later), not written."""
        meta = obj.get("metadata") or {}
        current = obj.get("status")
        desired = desired_status(
            key[0], generation=int(meta.get("generation") or 1), operation=operation,
            resume=resume, refusal=memo.refusal if operation is None else None,
            previous=current if isinstance(current, dict) else None, now=self.clock.now())
        live = [r for r in (operation, resume) if r is not None and not settled(r)]
        refused = memo.command_refused
        if refused is not None and (live or (refused.reason == "ResumeRefused"
                                    and resume is None)):
            desired["conditions"] = [*desired.get("conditions", []), _refused_condition(
                refused, current, int(meta.get("generation") or 1),
                self.clock.now())]
        patch = status_patch(current if isinstance(current, dict) else None, desired)
        if not patch:
            return True
        loop = asyncio.get_running_loop()
        wait = memo.status_written_at + self.settings.status_interval - loop.time()
        if wait > 0:  # rate-limited: this resource's status was written a moment ago
            self._later(key, wait)
            return False
        await self._patch(key, {"status": patch}, status=True)
        memo.status_written_at = loop.time()
        return True


def _mirrored(memo: _Memo, *records: MachineRecord | None) -> None:
    """Note the versions a pass wrote the status from (see ``_Memo.mirrored``)."""
    for record in records:
        if record is None:
            continue
        if record.terminal and not settled(record):
            memo.mirrored.pop(record.id, None)  # it settles without a new version
        else:
            memo.mirrored[record.id] = record.version


def _uid(obj: Resource) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _refused_before(obj: Resource) -> Refusal | None:
    """The ``Accepted=False`` the resource's status holds for its current generation (a
    restart must not submit again what was refused)."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    for condition in status.get("conditions") or []:
        if (isinstance(condition, dict) and condition.get("type") == "Accepted"
                and condition.get("status") == "False"
                and condition.get("observedGeneration") == generation):
            return Refusal(str(condition.get("reason")), str(condition.get("message") or ""))
    return None


def _refused_condition(refusal: Refusal, current: object, generation: int,
                       now: datetime) -> dict[str, Any]:
    """``CommandRefused=True``: what the machine answered the resource's last command."""
    since = rfc3339(now)
    for c in (current.get("conditions") or []) if isinstance(current, dict) else []:
        if isinstance(c, dict) and c.get("type") == "CommandRefused" and c.get(
                "status") == "True" and c.get("lastTransitionTime"):
            since = str(c["lastTransitionTime"])
    return {"type": "CommandRefused", "status": "True", "reason": refusal.reason,
            "message": refusal.message, "lastTransitionTime": since,
            "observedGeneration": generation}


def _one_line(exc: BaseException) -> str:
    """The error's first line (a ``ControlPlaneError`` says its hint in it)."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
