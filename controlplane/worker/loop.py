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
   A machine that ends wakes the machines that wait on it (a drain, for its child:
   ``children.wake_parents``).

Crash safety: whatever was committed is durable, including the decision's actions (the
outbox column ``pending_actions``, written by the same commit). A worker killed between
commit and action, or mid-action, loses only its lease: the next owner first performs the
pending actions (idempotent by key), then decides again. A stale worker's commit is
refused by the lease fence (``LeaseLost``) or the version check (``ConcurrencyConflict``).

A machine this worker cannot read (a kind, a state field or value, an outbox action of a
newer release: ``readable``) is given back untouched, due, and never claimed by this
worker again: left to a newer worker, logged once and counted, never guessed at.

A decision that fails a step (``Decision.confirm``) or would end the machine (its folded
state terminal) is not taken on a cache's word: given a ``confirm`` observer (pods and
nodes read from the API server), the worker reads the machine's pods and nodes through
once more and decides again on that.
A watch cache can lag what this very process has already read (a resumed watch that
says "synced" before its backlog is applied): a capture failed as ``SourceGone`` from a
stale ``Pending`` copy of a pod that was Running. The cost is a GET per pod of interest
at each failure and at the end of an operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from structlog.stdlib import BoundLogger

from controlplane.clock import Clock, new_id
from controlplane.engine.decider import Action, Cause, Decider, Decision, Event, fold
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import EMPTY_OBSERVATION, Interests, Observation
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
from controlplane.worker.child_machines import wake_parents
from controlplane.worker.committer import GroupCommitter
from controlplane.worker.metrics import WorkerMetrics
from controlplane.worker.ports import Observer
from controlplane.worker.readable import LeftMachines, Unreadable, read_claimed

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


@dataclass(slots=True)
class _Held:
    """A machine while this worker drives it under one lease: what its steps move on."""

    decider: Decider[Any]
    lease: Lease
    attempts: int  # consecutive troubled claims, 1 = this one (backoffs grow with it)
    state: Any
    version: int
    log: BoundLogger  # bound to the machine, its phase and its version
    #: The last action-only decision: the same one again means the world has not caught up.
    previous_actions: tuple[Action, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Stepped:
    """What one step saw, decided and failed at: whether to step again depends on it."""

    decision: Decision
    observation: Observation
    now: datetime
    failure: ActionFailure | None


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
        *,
        confirm: Observer | None = None,
    ) -> None:
        self.db = db
        self.kinds = kinds
        self.observer = observer
        self.confirm = confirm  # pods and nodes read through, for a decision that ends
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
        self._ended: list[str] = []  # machines that ended, whose parents to wake
        self._waking: asyncio.Task[None] | None = None
        self.left = LeftMachines()  # machines left to a newer worker

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
            if self._waking is not None:
                await self._waking
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
            lease_seconds=cfg.lease_seconds, kinds=cfg.kinds, exclude=self.left.excluded,
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
        try:
            held = self._hold(claimed)
        except Unreadable as why:
            await self._leave(claimed, why)
            return
        try:
            if claimed.record.pending_actions:
                await self._perform_outbox(held, claimed.record.pending_actions)
            for _ in range(self.config.max_steps_per_lease):
                if await self._release_after(held, await self._step(held)):
                    return
            await self._release(held.lease, self.clock.now())  # fairness: let others have a turn
        except Exception as exc:
            await self._let_go_after_error(held, exc)

    def _hold(self, claimed: Claimed) -> _Held:
        """The claimed machine's state as its row has it, and a log bound to it."""
        record = claimed.record
        decider, state = read_claimed(record, self.kinds, self.actions.knows)
        return _Held(
            decider=decider, lease=claimed.lease, attempts=record.attempts,
            state=state, version=record.version,
            log=log.bind(machine_id=record.id, kind=record.kind, phase=state.phase,
                         seq=record.version),
        )

    async def _perform_outbox(self, held: _Held, pending: list[JsonObject]) -> None:
        """A previous owner committed a decision but may not have acted on it: act now."""
        outbox = tuple(map(event_store.action_from_json, pending))
        held.log.info("performing actions left by a previous owner",
                      actions=[a.key for a in outbox])
        failure = await self.actions.run_all(outbox)
        if failure is not None:
            await self._record_failure(held, failure)

    async def _step(self, held: _Held) -> _Stepped:
        """One round: observe the machine's interests, decide, commit the events with the
        decision's actions (the outbox), perform the actions."""
        decider = held.decider
        interests = decider.interests(held.state)
        observation = (EMPTY_OBSERVATION if interests.empty
                       else await self.observer.observe(interests))
        now = self.clock.now()
        observation, decision = await self._decide(held, observation, now)
        if self._ends(held, decision) and (interests.pods or interests.nodes):
            observation, decision = await self._confirmed(held, interests, observation, now)
        if decision.events:
            await self._commit(held, decision.events, now, Cause.OBSERVATION,
                               {"observation": observation.to_json()}, outbox=decision.actions)
            held.log.info("transition", events=[e.type for e in decision.events])
        failure = await self.actions.run_all(decision.actions)
        if failure is not None:
            await self._record_failure(held, failure)
            held.log.warning("action failed", action=failure.action.type,
                             key=failure.action.key, error=failure.message)
        return _Stepped(decision, observation, now, failure)

    async def _decide(self, held: _Held, observation: Observation,
                      now: datetime) -> tuple[Observation, Decision]:
        """Decide; when the decision names registry tags it cannot do without, observe
        them and decide again (twice at most: a decider asks for what it lacks at once)."""
        decision = held.decider.decide(held.state, observation, now)
        for _ in range(2):
            wanted = decision.needs_tags - observation.tags.keys()
            if not wanted or not decision.idle:
                break
            looked = await self.observer.observe(Interests(tags=frozenset(wanted)))
            observation = replace(observation, tags={**observation.tags, **looked.tags})
            decision = held.decider.decide(held.state, observation, now)
        return observation, decision

    def _ends(self, held: _Held, decision: Decision) -> bool:
        """Whether the decision gives up a step (``confirm``) or ends the machine."""
        return self.confirm is not None and bool(decision.events) and (
            decision.confirm or fold(held.decider, held.state, decision.events).terminal)

    async def _confirmed(self, held: _Held, interests: Interests, observation: Observation,
                         now: datetime) -> tuple[Observation, Decision]:
        """Decide again on the machine's pods and nodes as the API server has them now."""
        assert self.confirm is not None
        fresh = await self.confirm.observe(Interests(pods=interests.pods,
                                                     nodes=interests.nodes))
        confirmed = replace(observation, pods=fresh.pods, nodes=fresh.nodes)
        self.metrics.confirmations += 1
        if confirmed != observation:
            self.metrics.overturned += 1
            held.log.info("cache disagreed with the server; decided again on a fresh read")
        return await self._decide(held, confirmed, now)

    async def _release_after(self, held: _Held, step: _Stepped) -> bool:
        """Release the lease if ``step`` ends this turn: the machine is terminal, the worker
        is stopping, or nothing changed (due again at its wake). ``False``: step again."""
        if held.state.terminal:
            await self._release(held.lease, None)
            held.log.info("terminal")
            self._wake_parents_of(held.lease.machine_id)
            return True
        if self._stopping.is_set():  # shutting down: this step is done, hand over
            await self._release(held.lease, self.clock.now())
            held.log.info("released for shutdown")
            return True
        decision = step.decision
        if decision.events or step.failure is not None:
            return False
        if decision.actions and decision.actions != held.previous_actions:
            held.previous_actions = decision.actions
            return False
        unseen = step.observation.failed_probes()
        retry_at = self._probe_retry_at(held.attempts, step.now) if unseen else None
        if unseen:
            held.log.info("probe failed; looking again", keys=unseen, retry_at=retry_at)
        await self._release(held.lease, self._sleep_until(decision, step.now, retry_at),
                            reset_attempts=not unseen)
        return True

    async def _leave(self, claimed: Claimed, why: Unreadable) -> None:
        """Give an unreadable machine back as it is, due now, for a newer worker."""
        self.left.leave(claimed.record, why, worker_id=self.config.worker_id)
        self.metrics.machines_left = self.left.by_reason
        self.metrics.machines_left_now = len(self.left.ids)
        try:
            await leases.leave(self.db, lease=claimed.lease, now=self.clock.now())
        except (StaleWriter, DatabaseUnavailable) as exc:  # the lease expires on its own
            log.info("could not hand a left machine back; its lease will expire",
                     machine_id=claimed.record.id, error=str(exc))

    def _wake_parents_of(self, machine_id: str) -> None:
        """A machine ended: wake whoever waits on it (a drain, for its child) now rather
        than at its safety re-check. In the background, batched: awaiting the wake here
        kept the machine's slot one more round trip, which halved the group commits
        (``bench.engine_throughput`` at concurrency 32: 30 -> 15 a group, a third of the
        throughput). One statement wakes every machine that ended meanwhile."""
        self._ended.append(machine_id)
        if self._waking is None or self._waking.done():
            self._waking = asyncio.create_task(self._wake_ended())

    async def _wake_ended(self) -> None:
        while self._ended:
            ended, self._ended = self._ended, []
            try:
                woken = await wake_parents(self.db, ended, now=self.clock.now())
            except Exception as exc:  # the parents' re-check still comes
                log.warning("could not wake the parents of ended machines", error=repr(exc),
                            machines=len(ended))
                continue
            if woken:
                self.nudge()  # look for them here at once

    async def _let_go_after_error(self, held: _Held, exc: Exception) -> None:
        """The error policy of driving a machine, in one place:

        - a stale writer (``LeaseLost``, ``ConcurrencyConflict``) lost the race: release now;
        - the database is unavailable: nothing can be written, the lease will expire;
        - anything else is a bug in a decider, observer or handler, which must not stop the
          worker: release with a backoff on the machine's consecutive troubled claims.
        """
        if isinstance(exc, StaleWriter):
            if isinstance(exc, LeaseLost):
                self.metrics.lease_losses += 1
            else:
                self.metrics.conflicts += 1
            held.log.info("lost the race, letting go", reason=str(exc))
            with contextlib.suppress(StaleWriter, DatabaseUnavailable):
                await self._release(held.lease, self.clock.now())
        elif isinstance(exc, DatabaseUnavailable):
            held.log.warning("database unavailable mid-decision; the lease will expire",
                             error=str(exc))
        else:
            self.metrics.step_crashes += 1
            delay = _backoff_seconds(held.attempts, self.config.error_backoff_seconds,
                                     self.config.error_backoff_max_seconds)
            held.log.exception("machine step crashed; retrying later", error=repr(exc),
                               retry_in=delay)
            with contextlib.suppress(StaleWriter, DatabaseUnavailable):
                await self.committer.release(ReleaseRequest(
                    held.lease, self.clock.now(), self.clock.now() + timedelta(seconds=delay),
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
        held: _Held,
        events: tuple[Event, ...],
        now: datetime,
        cause: Cause,
        decision_input: dict[str, Any],
        outbox: tuple[Action, ...] = (),
    ) -> None:
        state = held.state
        new_state = fold(held.decider, state, events)
        keys = new_state.wake_keys
        version = await self.committer.commit(CommitRequest(
            machine_id=held.lease.machine_id, expected_version=held.version, events=events,
            projection=Projection(new_state.phase, new_state.to_json(), new_state.terminal,
                                  keys if keys != state.wake_keys else None),
            cause=cause, decision_input=decision_input, now=now,
            worker_id=self.config.worker_id, lease=held.lease, outbox=outbox,
        ))
        self.transitions += len(events)
        self.metrics.transitions[held.decider.kind] += len(events)
        held.state, held.version = new_state, version
        held.log = held.log.bind(phase=new_state.phase, seq=version)

    async def _record_failure(self, held: _Held, failure: ActionFailure) -> None:
        now = self.clock.now()
        self.metrics.action_failures[(failure.action.type, failure.error_class)] += 1
        event = failure.to_event(now).recorded({"error_class": failure.error_class})
        await self._commit(held, (event,), now, Cause.ENGINE, {"action_failure": event.data})

    async def _release(self, lease: Lease, wake_at: datetime | None, *,
                       reset_attempts: bool = True) -> None:
        await self.committer.release(ReleaseRequest(lease, self.clock.now(), wake_at,
                                                    reset_attempts=reset_attempts))


def _backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """``base`` doubled per consecutive troubled claim (``attempts``, 1 = this one), capped."""
    grown: float = base * 2.0 ** min(max(attempts - 1, 0), 30)
    return min(grown, cap)
