"""The worker: lease due machines, observe, decide, commit, act, release — forever.

One loop claims batches of due machines (``store.leases.claim_due``) up to the
configured concurrency and drives each in its own task; one heartbeat task keeps every
held lease alive while deciding and acting. Driving a machine:

1. observe what its state says matters (``decider.interests`` -> ``Observer``);
2. ``decide(state, observation, now)``; fold the events with ``evolve``;
3. commit events + projection in one transaction, fenced by the lease token (concurrent
   machines share that transaction: see ``committer``);
4. run the actions (idempotent, retried); a failure is committed as ``ActionFailed``;
5. if the decision changed something, go to 1 while holding the lease (a chain of
   transitions costs one commit each, not a claim + commit + release); otherwise release,
   due at ``wake_at``. The same action-only decision twice in a row means the world has
   not caught up yet: sleep until ``wake_at`` or ``settle_seconds``, whichever is sooner.
   An observation with a failed probe (a 429, a timeout: the truth is unknown) is looked
   at again after ``probe_retry_seconds``, doubling per consecutive failed look up to
   ``probe_retry_max_seconds``, however far the decision's own ``wake_at`` is: a decider
   waits for a deadline or a wake, and a wake may never come for what nobody saw change
   (a requeue with backoff, as a Kubernetes controller does on a failed reconcile).

Crash safety: whatever was committed is durable, including the decision's actions (the
outbox column ``pending_actions``, written by the same commit). A worker killed between
commit and action, or mid-action, loses only its lease: the next owner first performs the
pending actions (idempotent by key), then decides again. A stale worker's commit is
refused by the lease fence (``LeaseLost``) or the version check (``ConcurrencyConflict``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from controlplane.clock import Clock, new_id
from controlplane.engine.decider import ACTION_FAILED, Action, Decider, Decision, Event, fold
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import EMPTY_OBSERVATION
from controlplane.logs import get_logger
from controlplane.machines.submission import Limits
from controlplane.store import event_store, leases
from controlplane.store.database import Database
from controlplane.store.errors import DatabaseUnavailable, LeaseLost, StaleWriter
from controlplane.store.event_store import CommitRequest
from controlplane.store.leases import ReleaseRequest
from controlplane.store.records import Claimed, Lease, Projection
from controlplane.worker.actions import ActionFailure, ActionRunner
from controlplane.worker.admitter import admit_held
from controlplane.worker.committer import GroupCommitter
from controlplane.worker.metrics import WorkerMetrics
from controlplane.worker.ports import Observer

log = get_logger("controlplane.worker")


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str = field(default_factory=lambda: f"worker-{new_id()[:8]}")
    concurrency: int = 32
    batch_size: int = 32
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_seconds: float = 0.5
    max_steps_per_lease: int = 50
    settle_seconds: float = 1.0
    error_backoff_seconds: float = 1.0
    error_backoff_max_seconds: float = 300.0
    probe_retry_seconds: float = 2.0
    probe_retry_max_seconds: float = 30.0
    drain_seconds: float = 30.0
    kinds: tuple[str, ...] | None = None
    #: Admission limits; when set, this worker also admits held operations.
    limits: Limits | None = None


class Worker:
    """Drives machines of the registered kinds until ``stop()``."""

    def __init__(
        self,
        db: Database,
        kinds: KindRegistry,
        observer: Observer,
        actions: ActionRunner,
        clock: Clock,
        config: WorkerConfig | None = None,
    ) -> None:
        self.db = db
        self.kinds = kinds
        self.observer = observer
        self.actions = actions
        self.clock = clock
        self.config = config or WorkerConfig()
        self._stopping = asyncio.Event()
        self._nudged = asyncio.Event()
        self._tokens: dict[str, int] = {}  # lease token -> machines still held under it
        self._in_flight: set[asyncio.Task[None]] = set()
        self.committer = GroupCommitter(db)
        self.transitions = 0
        self.metrics = WorkerMetrics()

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight machines finish their step and are released."""
        self._stopping.set()
        self._nudged.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def nudge(self) -> None:
        """Look for due machines now instead of at the next poll."""
        self._nudged.set()

    async def run(self) -> None:
        """Claim and drive machines until :meth:`stop`; then drain in-flight work."""
        cfg = self.config
        log.info("worker started", worker_id=cfg.worker_id, db=self.db.display_url,
                 concurrency=cfg.concurrency, lease_seconds=cfg.lease_seconds)
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        backoff = cfg.poll_seconds
        try:
            while not self._stopping.is_set():
                self.metrics.last_loop = time.monotonic()
                try:
                    if cfg.limits is not None:
                        await admit_held(self.db, cfg.limits, now=self.clock.now())
                    wanted = self._free_slots()
                    claimed = await self.claim_batch()
                    backoff = cfg.poll_seconds
                except DatabaseUnavailable as exc:
                    backoff = min(max(backoff * 2, 0.5), 30.0)
                    log.warning("database unavailable, backing off", error=str(exc),
                                retry_in=backoff)
                    await self._pause(backoff)
                    continue
                if len(claimed) < wanted:
                    await self._pause(cfg.poll_seconds)  # nothing more is due right now
                else:
                    # More may be due: claim again once a quarter of the slots are free,
                    # not in a tight loop of one-machine claims.
                    await self._wait_for_slots()
        finally:
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self.committer.close()
            log.info("worker stopped", worker_id=cfg.worker_id, transitions=self.transitions)

    async def _pause(self, seconds: float) -> None:
        self._nudged.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._nudged.wait()

    def _free_slots(self) -> int:
        return min(self.config.batch_size, self.config.concurrency - len(self._in_flight))

    async def _wait_for_slots(self) -> None:
        """Wait until a quarter of the slots (at least one, at most a batch) are free — but
        no longer than one poll interval, so a free slot never idles while work is due."""
        want_free = max(1, min(self.config.batch_size, self.config.concurrency // 4))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.poll_seconds):
                while (self.config.concurrency - len(self._in_flight) < want_free
                       and not self._stopping.is_set()):
                    stopping = asyncio.ensure_future(self._stopping.wait())
                    try:
                        await asyncio.wait({stopping, *self._in_flight},
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        stopping.cancel()

    async def _drain(self) -> None:
        if not self._in_flight:
            return
        log.info("draining in-flight machines", count=len(self._in_flight))
        _done, pending = await asyncio.wait(self._in_flight, timeout=self.config.drain_seconds)
        for task in pending:  # their leases simply expire; another worker takes over
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def claim_batch(self) -> list[Claimed]:
        """Claim what fits in the free slots and start driving it (returns the claims)."""
        cfg = self.config
        free = self._free_slots()
        if free <= 0:
            return []
        token = new_id()
        claimed = await leases.claim_due(
            self.db, owner=cfg.worker_id, token=token, now=self.clock.now(), limit=free,
            lease_seconds=cfg.lease_seconds, kinds=cfg.kinds,
        )
        if claimed:
            self._tokens[token] = len(claimed)
            self.metrics.claims += len(claimed)
        for c in claimed:
            task = asyncio.create_task(self._drive_and_account(c))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
        return claimed

    async def _drive_and_account(self, claimed: Claimed) -> None:
        try:
            await self.drive(claimed)
        finally:
            token = claimed.lease.token
            self._tokens[token] -= 1
            if self._tokens[token] <= 0:
                del self._tokens[token]

    async def _heartbeat_loop(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.heartbeat_seconds)
            for token in list(self._tokens):
                try:
                    await leases.heartbeat(self.db, owner=cfg.worker_id, token=token,
                                           now=self.clock.now(), lease_seconds=cfg.lease_seconds)
                except DatabaseUnavailable as exc:
                    log.warning("heartbeat failed", error=str(exc))
                except Exception as exc:  # the loop must outlive any error
                    # A dead heartbeat loop lets every lease of this worker expire.
                    log.warning("heartbeat failed unexpectedly", error=repr(exc))

    # -- driving one machine -----------------------------------------------------------

    async def drive(self, claimed: Claimed) -> None:
        """Observe -> decide -> commit -> act, while the machine keeps changing."""
        record, lease = claimed.record, claimed.lease
        decider = self.kinds.get(record.kind)
        state: Any = decider.load_state(record.state)
        version = record.version
        bound = log.bind(machine_id=record.id, kind=record.kind, phase=state.phase, seq=version)
        previous_actions: tuple[object, ...] | None = None
        try:
            if record.pending_actions:
                # A previous owner committed a decision but may not have acted on it.
                outbox = tuple(map(event_store.action_from_json, record.pending_actions))
                bound.info("performing actions left by a previous owner",
                           actions=[a.key for a in outbox])
                failure = await self.actions.run_all(outbox)
                if failure is not None:
                    state, version = await self._record_failure(decider, state, version,
                                                                lease, failure)
                    bound = bound.bind(phase=state.phase, seq=version)
            for _ in range(self.config.max_steps_per_lease):
                interests = decider.interests(state)
                observation = (EMPTY_OBSERVATION if interests.empty
                               else await self.observer.observe(interests))
                now = self.clock.now()
                decision = decider.decide(state, observation, now)
                if decision.events:
                    state, version = await self._commit(
                        decider, state, version, lease, decision.events, now,
                        "observation", {"observation": observation.to_json()},
                        outbox=decision.actions,
                    )
                    bound = bound.bind(phase=state.phase, seq=version)
                    bound.info("transition", events=[e.type for e in decision.events])
                failure = await self.actions.run_all(decision.actions)
                if failure is not None:
                    state, version = await self._record_failure(decider, state, version,
                                                                lease, failure)
                    bound = bound.bind(phase=state.phase, seq=version)
                    bound.warning("action failed", action=failure.action.type,
                                  key=failure.action.key, error=failure.message)
                if state.terminal:
                    await self._release(lease, None)
                    bound.info("terminal")
                    return
                if self._stopping.is_set():  # shutting down: this step is done, hand over
                    await self._release(lease, self.clock.now())
                    bound.info("released for shutdown")
                    return
                if decision.events or failure is not None:
                    continue
                if decision.actions and decision.actions != previous_actions:
                    previous_actions = decision.actions
                    continue
                unseen = observation.failed_probes()
                retry_at = self._probe_retry_at(record.attempts, now) if unseen else None
                if unseen:
                    bound.info("probe failed; looking again", keys=unseen, retry_at=retry_at)
                await self._release(lease, self._sleep_until(decision, now, retry_at),
                                    reset_attempts=not unseen)
                return
            await self._release(lease, self.clock.now())  # fairness: let others have a turn
        except StaleWriter as exc:
            if isinstance(exc, LeaseLost):
                self.metrics.lease_losses += 1
            else:
                self.metrics.conflicts += 1
            bound.info("lost the race, letting go", reason=str(exc))
            with contextlib.suppress(StaleWriter, DatabaseUnavailable):
                await self._release(lease, self.clock.now())
        except DatabaseUnavailable as exc:
            bound.warning("database unavailable mid-decision; the lease will expire",
                          error=str(exc))
        except Exception as exc:  # a bug in a decider/observer/handler must not stop the worker
            self.metrics.step_crashes += 1
            delay = _backoff_seconds(record.attempts, self.config.error_backoff_seconds,
                                     self.config.error_backoff_max_seconds)
            bound.exception("machine step crashed; retrying later", error=repr(exc),
                            retry_in=delay)
            with contextlib.suppress(StaleWriter, DatabaseUnavailable):
                await self.committer.release(ReleaseRequest(
                    lease, self.clock.now(), self.clock.now() + timedelta(seconds=delay),
                    reset_attempts=False))

    def _sleep_until(self, decision: Decision, now: datetime,
                     retry_at: datetime | None) -> datetime | None:
        wake = decision.wake_at
        if decision.actions:
            settle = now + timedelta(seconds=self.config.settle_seconds)
            wake = settle if wake is None else min(settle, wake)
        if retry_at is not None:
            wake = retry_at if wake is None else min(retry_at, wake)
        return wake

    def _probe_retry_at(self, attempts: int, now: datetime) -> datetime:
        """When to look again after a failed probe: ``attempts`` counts this machine's
        claims since its last clean observation (1 = this one)."""
        return now + timedelta(seconds=_backoff_seconds(
            attempts, self.config.probe_retry_seconds, self.config.probe_retry_max_seconds))

    async def _commit(
        self,
        decider: Decider[Any],
        state: Any,
        version: int,
        lease: Lease,
        events: tuple[Event, ...],
        now: datetime,
        cause: str,
        decision_input: dict[str, Any],
        outbox: tuple[Action, ...] = (),
    ) -> tuple[Any, int]:
        new_state = fold(decider, state, events)
        keys = new_state.wake_keys
        version = await self.committer.commit(CommitRequest(
            machine_id=lease.machine_id, expected_version=version, events=events,
            projection=Projection(new_state.phase, new_state.to_json(), new_state.terminal,
                                  keys if keys != state.wake_keys else None),
            cause=cause, decision_input=decision_input, now=now,
            worker_id=self.config.worker_id, lease=lease, outbox=outbox,
        ))
        self.transitions += len(events)
        self.metrics.transitions[decider.kind] += len(events)
        return new_state, version

    async def _record_failure(
        self, decider: Decider[Any], state: Any, version: int, lease: Lease,
        failure: ActionFailure,
    ) -> tuple[Any, int]:
        now = self.clock.now()
        self.metrics.action_failures[(failure.action.type, failure.error_class)] += 1
        data = failure.to_event_data(now)
        event = Event(ACTION_FAILED, data, {"error_class": failure.error_class})
        return await self._commit(decider, state, version, lease, (event,), now,
                                  "engine", {"action_failure": data})

    async def _release(self, lease: Lease, wake_at: datetime | None, *,
                       reset_attempts: bool = True) -> None:
        await self.committer.release(ReleaseRequest(lease, self.clock.now(), wake_at,
                                                    reset_attempts=reset_attempts))


def _backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """``base`` doubled per consecutive troubled claim (``attempts``, 1 = this one), capped."""
    grown: float = base * 2.0 ** min(max(attempts - 1, 0), 30)
    return min(grown, cap)
