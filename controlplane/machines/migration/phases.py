"""The ``migration`` machine's ``decide``: one function per phase (see ``migration``).

Each function returns a :class:`~controlplane.machines.base.common.Step`; the decider turns it
into the engine's ``Decision``. The source deletion guard is
:func:`controlplane.machines.steps.source.decide_deletion`; the restore rule is here:

- ``_restore``: once the source is gone the restore finishes somewhere: a failed target
  attempt rolls back to the source node; the artifact is kept until a restore is verified.

Called by :class:`controlplane.machines.migration.machine.MigrationDecider`. Pure.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.engine.observation import Observation, ProbeError
from controlplane.machines.base.common import (
    Step,
    action_key,
    emit,
    pod_facts,
    seconds,
    wait,
)
from controlplane.machines.config.classes import OnFailure
from controlplane.machines.contract.actions import EventType, emit_event
from controlplane.machines.migration.events import MigrationFinished, RollbackStarted
from controlplane.machines.migration.state import (
    MigrationPhase,
    MigrationState,
)
from controlplane.machines.steps import capture as cap_
from controlplane.machines.steps import collect as gc_
from controlplane.machines.steps import restore as rs_
from controlplane.machines.steps import source as src_
from controlplane.machines.steps.capture import CaptureStatus
from controlplane.machines.steps.restore import RestorePlan, RestoreStatus
from controlplane.machines.steps.source import SourceVanished

_NOT_OBSERVED = ProbeError("NotObserved", "not observed")


def decide_migration(state: MigrationState, obs: Observation, now: datetime) -> Step:
    s = state.status
    if s is MigrationPhase.CHECKPOINTING:
        assert state.started_at is not None
        return cap_.decide_capture(state.spec.capture, state.capture, obs, now,
                                   machine_id=state.machine_id, started_at=state.started_at)
    if s is MigrationPhase.UNSTICKING:
        return _unstick(state, obs, now)
    if s is MigrationPhase.WAKING_IN_PLACE:
        return _wake(state, obs, now)
    if s is MigrationPhase.DELETING_SOURCE:
        return _delete_source(state, obs, now)
    if s in (MigrationPhase.RESTORING, MigrationPhase.ROLLING_BACK):
        return _restore(state, obs, now)
    if s is MigrationPhase.COLLECTING_GARBAGE:
        return _collect(state, obs, now)
    return Step()


def _finish(state: MigrationState, now: datetime, phase: MigrationPhase, reason: str,
            message: str, *, final_node: str | None = None) -> Step:
    c = state.spec.capture
    warning = phase not in (MigrationPhase.SUCCEEDED, MigrationPhase.CANCELLED)
    event = MigrationFinished(at=now, phase=phase.value, reason=reason, message=message,
                              final_node=final_node).recorded()
    notice = emit_event(action_key(state.machine_id, "event", "finished"),
                        namespace=c.namespace, pod_name=c.name, pod_uid=c.uid,
                        type_=EventType.WARNING if warning else EventType.NORMAL,
                        reason=f"Migration{phase.value}", message=f"{reason}: {message}")
    return emit(event, actions=[notice])


def _unstick(state: MigrationState, obs: Observation, now: datetime) -> Step:
    failure = state.failure
    assert failure is not None
    since = state.capture.failed_at or state.started_at
    assert since is not None
    result = src_.decide_unstick(
        state.source_op, state.source, obs, now, machine_id=state.machine_id,
        kill=state.klass.on_failure is OnFailure.KILL, timeout=state.klass.timeouts.release,
        since=since,
        reason=f"capture failed: {failure.reason}")
    if isinstance(result, Step):
        return result
    note = f"; source NOT unstuck: {result.note}" if result.note else ""
    return _finish(state, now, MigrationPhase.FAILED, failure.reason, failure.message + note,
                   final_node=None)


def _wake(state: MigrationState, obs: Observation, now: datetime) -> Step:
    since = state.started_at
    assert since is not None
    result = src_.decide_unstick(
        state.source_op, state.source, obs, now, machine_id=state.machine_id, kill=False,
        timeout=state.klass.timeouts.release, since=since, reason="wake the workload in place")
    if isinstance(result, Step):
        return result
    if result.how in ("pod-gone", "pod-terminating"):
        if state.capture.status is CaptureStatus.VERIFIED:
            # The source went away: its state lives only in the artifact. Restore it
            # where it was (gate 6) instead of ending with nothing running.
            facts = pod_facts(state.spec.capture.pod_key,
                              obs.pods.get(state.spec.capture.pod_key, _NOT_OBSERVED))
            return emit(SourceVanished(at=now, target=state.spec.source_node,
                                       during="wake").recorded(facts))
        return _finish(state, now, MigrationPhase.FAILED, "SourceGone",
                       "the source pod went away before its state was captured")
    if result.note:
        return _finish(state, now, MigrationPhase.FAILED, "WakeInPlaceFailed",
                       f"the workload may still be stopped: {result.note}",
                       final_node=state.spec.source_node)
    if state.abort is not None:
        return _finish(state, now, MigrationPhase.FAILED, state.abort.reason,
                       f"{state.abort.message}; workload resumed in place",
                       final_node=state.spec.source_node)
    reason = "Cancelled" if state.cancelled else "RetargetedToSource"
    return _finish(state, now, MigrationPhase.CANCELLED, reason,
                   "workload resumed in place on " + state.spec.source_node,
                   final_node=state.spec.source_node)


def _delete_source(state: MigrationState, obs: Observation, now: datetime) -> Step:
    assert state.pinned is not None
    assert state.verified_at is not None
    return src_.decide_deletion(
        state.source_op if state.deletion_requested else None, state.source, state.pinned,
        obs, now, machine_id=state.machine_id, verified_at=state.verified_at,
        timeout=state.klass.timeouts.delete)


#: How often a kept name is looked at again while a pod still holds it.
NAME_POLL = seconds(1)


def _kept_name(state: MigrationState, obs: Observation, now: datetime) -> str | Step | None:
    """The restored pod's own name when the spec keeps it and no pod holds it any more;
    a wait while one does (the source terminating, an earlier attempt's pod going); None
    for the suffixed name (the name is not kept, or it stayed taken past the delete
    timeout: the workload matters more than its name)."""
    if not state.spec.keep_name:
        return None
    if obs.pods.get(state.spec.name_key, _NOT_OBSERVED) is None:
        return state.spec.restore_name
    give_up = (state.restore_due_at or now) + seconds(state.klass.timeouts.delete)
    if now >= give_up:
        return None
    return wait(give_up, now + NAME_POLL)


def _plan(state: MigrationState, node: str, name: str | None) -> RestorePlan:
    attempt = state.attempts + 1
    c = state.spec.capture
    return RestorePlan(
        attempt=attempt, namespace=c.namespace,
        pod_name=name or rs_.restore_pod_name(state.spec.restore_name, state.machine_id,
                                              attempt),
        node=node, artifact=state.pinned, checkpoint_id=c.checkpoint_id,
        not_fresh=(state.capture.source_instance,) if state.capture.source_instance else ())


def _restore(state: MigrationState, obs: Observation, now: datetime) -> Step:
    r, ctx, mid = state.restore, state.context(), state.machine_id
    if r is not None and r.in_flight and r.plan.node != state.target:
        return rs_.abandon_restore(r, now, f"retargeted to {state.target}")
    if r is not None and r.status is not RestoreStatus.CLEANED:
        return rs_.decide_restore(r, ctx, obs, now, machine_id=mid)
    if r is not None and not r.superseded:
        assert r.failure is not None
        if state.failures >= state.klass.restore_attempts:
            return _finish(state, now, MigrationPhase.FAILED, "RestoreFailed",
                           f"{state.failures} restore attempt(s) failed, the last on "
                           f"{r.plan.node}: {r.failure.reason}: {r.failure.message}; the "
                           f"artifact {state.pinned} is preserved for a manual restore")
    name = _kept_name(state, obs, now)
    if isinstance(name, Step):
        return name
    if r is not None and not r.superseded and state.target != state.spec.source_node:
        assert r.failure is not None
        rollback = RollbackStarted(
            at=now, failed_node=r.plan.node, reason=r.failure.reason,
            message=r.failure.message, node=state.spec.source_node).recorded()
        start = rs_.start_restore(_plan(state, state.spec.source_node, name), ctx, now,
                                  machine_id=mid)
        return emit(rollback, *start.events, actions=start.actions)
    return rs_.start_restore(_plan(state, state.target, name), ctx, now, machine_id=mid)


def _collect(state: MigrationState, obs: Observation, now: datetime) -> Step:
    c, r = state.collection, state.restore
    assert c is not None
    assert r is not None
    if c.outcome == "abandoned":
        return _finish(state, now, MigrationPhase.GC_FAILED, "GarbageCollectionFailed",
                       f"workload restored on {state.final_node}, but artifact {c.pinned} "
                       f"could not be deleted: {c.last_error or 'not observed gone'}",
                       final_node=state.final_node)
    if c.outcome:
        if state.cancelled:
            phase, reason = MigrationPhase.CANCELLED, "Cancelled"
        elif state.final_node == state.spec.source_node:
            phase, reason = MigrationPhase.ROLLED_BACK, "RolledBack"
        else:
            phase, reason = MigrationPhase.SUCCEEDED, "Migrated"
        return _finish(state, now, phase, reason,
                       f"workload running on {state.final_node}; artifact {c.outcome}",
                       final_node=state.final_node)
    notify = gc_.Notify(r.plan.namespace, r.plan.pod_name, r.uid)
    return gc_.decide_collection(c, obs, now, machine_id=state.machine_id,
                                 keep=not state.klass.retention.delete_after_migration,
                                 notify=notify)
