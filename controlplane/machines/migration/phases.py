"""The ``migration`` machine's ``decide``: one function per phase (see ``migration``).

Each function returns a :class:`~controlplane.machines.base.stepping.Step`; the decider turns it
into the engine's ``Decision``. The source deletion guard is
:func:`controlplane.machines.stages.source.decide_deletion`; the restore rule is here:

- ``_restore``: once the source is gone the restore finishes somewhere: a failed target
  attempt rolls back to the source node; the artifact is kept until a restore is verified.
  With ``successor: adopt`` the source is still there (quiesced) while the restore runs:
  out of attempts, the source is woken in place instead.
- ``_adopt``: hand a verified restored pod to the source's ReplicaSet, then delete the
  source (see :class:`~controlplane.machines.migration.state.Adoption`).

Called by :class:`controlplane.machines.migration.machine.MigrationDecider`. Pure.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.engine.observation import Observation, PodView, ProbeError
from controlplane.machines.base.facts import merge_facts, pod_facts
from controlplane.machines.base.stepping import Step, action_key, emit, wait
from controlplane.machines.base.timing import REISSUE_AFTER, next_poll, seconds
from controlplane.machines.config.classes import OnFailure
from controlplane.machines.contract.actions import EventType, annotate_pod, emit_event
from controlplane.machines.migration.events import (
    Adopted,
    AdoptionAbandoned,
    AdoptionRequested,
    MigrationFinished,
    RollbackStarted,
)
from controlplane.machines.migration.state import (
    MigrationPhase,
    MigrationState,
    template_labels,
)
from controlplane.machines.stages import capture as cap_
from controlplane.machines.stages import collect as gc_
from controlplane.machines.stages import restore as rs_
from controlplane.machines.stages import source as src_
from controlplane.machines.stages.capture import CaptureStatus
from controlplane.machines.stages.restore import RestorePlan, RestoreStatus
from controlplane.machines.stages.source import SourceVanished

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
    if s is MigrationPhase.ADOPTING:
        return _adopt(state, obs, now)
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
    r = state.restore
    if r is not None and r.status not in (RestoreStatus.CLEANED, RestoreStatus.VERIFIED):
        # An adoption's restore beside the source: take its pod away first.
        if r.in_flight:
            return rs_.abandon_restore(r, now, "the source is woken in place")
        return rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)
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


#: What a failed StatefulSet migration adds: its successor may wait, gated, for a person.
_HELD = ("; a successor of {key} its controller recreated is held by the scheduling gate "
         "checkpoint.controlplane.dev/restore (so it never starts without the state): "
         "restore into it by hand, or remove the gate to start it cold")


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
    if state.spec.claims:  # the StatefulSet's successor: its name, claimed, not created
        name = c.name
    return RestorePlan(
        attempt=attempt, namespace=c.namespace,
        pod_name=name or rs_.restore_pod_name(state.spec.restore_name, state.machine_id,
                                              attempt),
        node=node, artifact=state.pinned, checkpoint_id=c.checkpoint_id,
        not_fresh=(state.capture.source_instance,) if state.capture.source_instance else (),
        claim_from=c.uid if state.spec.claims else "")


def _restore(state: MigrationState, obs: Observation, now: datetime) -> Step:
    r, ctx, mid = state.restore, state.context(), state.machine_id
    if r is not None and r.in_flight and r.plan.node != state.target:
        return rs_.abandon_restore(r, now, f"retargeted to {state.target}")
    if r is not None and r.status is not RestoreStatus.CLEANED:
        return rs_.decide_restore(r, ctx, obs, now, machine_id=mid)
    if r is not None and not r.superseded:
        assert r.failure is not None
        if state.spec.adopts and not state.source_gone and \
                state.failures >= state.klass.restore_attempts:
            return emit(AdoptionAbandoned(
                at=now, reason="RestoreFailed",
                message=f"{state.failures} restore attempt(s) failed, the last on "
                        f"{r.plan.node}: {r.failure.reason}: {r.failure.message}",
            ).recorded())
        if state.failures >= state.klass.restore_attempts:
            return _finish(state, now, MigrationPhase.FAILED, "RestoreFailed",
                           f"{state.failures} restore attempt(s) failed, the last on "
                           f"{r.plan.node}: {r.failure.reason}: {r.failure.message}; the "
                           f"artifact {state.pinned} is preserved for a manual restore"
                           + (_HELD.format(key=r.plan.key) if state.spec.claims else ""))
    name = _kept_name(state, obs, now)
    if isinstance(name, Step):
        return name
    if r is not None and not r.superseded and state.target != state.spec.source_node \
            and not (state.spec.adopts and not state.source_gone):
        assert r.failure is not None
        back = rs_.runtime_plan(_plan(state, state.spec.source_node, name), obs, now,
                                state.klass.runtime_paths())
        if isinstance(back, Step):
            return back
        rollback = RollbackStarted(
            at=now, failed_node=r.plan.node, reason=r.failure.reason,
            message=r.failure.message, node=state.spec.source_node).recorded()
        start = rs_.start_restore(back, ctx, now, machine_id=mid)
        return Step(events=(rollback, *start.events), actions=start.actions,
                    confirm=start.confirm)
    plan = rs_.runtime_plan(_plan(state, state.target, name), obs, now,
                            state.klass.runtime_paths())
    if isinstance(plan, Step):
        return plan
    return rs_.start_restore(plan, ctx, now, machine_id=mid)


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
                                 keep=state.spec.keep_checkpoint
                                 or not state.klass.retention.delete_after_migration,
                                 notify=notify)


#: The ``controller.kubernetes.io/pod-deletion-cost`` a source gets before the hand-over:
#: the lowest an int32 holds, so its ReplicaSet scales it away before any other pod.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
CHEAPEST = str(-2**31)


def _adopt(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """Hand the verified restored pod to the source's ReplicaSet, then delete the source.

    The restored pod ran with its labels parked, so the ReplicaSet neither counted it nor
    deleted it while it started. Now the source (quiesced, kept until this moment) gets
    the lowest ``pod-deletion-cost`` and the restored pod its labels back, both with UID
    preconditions: the ReplicaSet adopts the matching orphan and, counting one pod too
    many, scales away the cheapest, the source. Once the restored pod is observed owned,
    the source is deleted here too (UID precondition), so the hand-over never depends on
    the controller's choice. Not adopted by the deadline: both pods are left as they are
    and the migration fails loudly, the artifact kept.
    """
    r, a, c = state.restore, state.adoption, state.spec.capture
    assert r is not None
    assert r.uid is not None
    restored = obs.pods.get(r.plan.key, _NOT_OBSERVED)
    source = obs.pods.get(c.pod_key, _NOT_OBSERVED)
    facts = merge_facts(pod_facts(r.plan.key, restored), pod_facts(c.pod_key, source))
    if a is not None and a.owner:
        return _retire_source(state, a.owner, obs, now)
    labels = template_labels(state.spec.template)
    if isinstance(restored, PodView) and restored.uid == r.uid and \
            restored.controller.startswith("ReplicaSet/") and \
            all(restored.labels.get(k) == v for k, v in labels.items()):
        return emit(Adopted(at=now, owner=restored.controller).recorded(facts))
    if restored is None or (isinstance(restored, PodView) and (
            restored.uid != r.uid or restored.deleting)):
        return _finish(state, now, MigrationPhase.FAILED, "RestoredPodLost",
                       f"restored pod {r.plan.key} went away before its ReplicaSet took it; "
                       f"the source {c.pod_key} is kept stopped and {state.pinned} is "
                       "preserved: delete the source to let the ReplicaSet replace it, or "
                       "restore from the artifact")
    if a is not None and now >= a.deadline:
        return _finish(state, now, MigrationPhase.FAILED, "NotAdopted",
                       f"restored pod {r.plan.key} (running on {state.final_node}) was not "
                       f"adopted by {state.spec.capture.pod_key}'s ReplicaSet in time: is its "
                       "selector still matching the pod's labels? The source is kept "
                       f"stopped and {state.pinned} preserved; delete whichever pod you do "
                       "not want")
    if a is not None and now < a.requested_at + REISSUE_AFTER:
        return wait(a.deadline, next_poll(a.requested_at, now))
    if not isinstance(restored, PodView):
        return wait(a.deadline if a else now + REISSUE_AFTER, now + seconds(1))
    attempt = 1 if a is None else a.attempt + 1
    deadline = now + seconds(state.klass.timeouts.delete) if a is None else None
    mid = state.machine_id
    cheapest = annotate_pod(action_key(mid, "adopt", str(attempt), "cost"),
                            namespace=c.namespace, name=c.name, uid=c.uid,
                            annotations={DELETION_COST: CHEAPEST})
    handback = annotate_pod(action_key(mid, "adopt", str(attempt), "labels"),
                            namespace=r.plan.namespace, name=r.plan.pod_name, uid=r.uid,
                            annotations={}, labels=labels)
    event = AdoptionRequested(at=now, attempt=attempt, deadline=deadline).recorded(facts)
    return emit(event, actions=[cheapest, handback])


def _retire_source(state: MigrationState, owner: str, obs: Observation,
                   now: datetime) -> Step:
    """After the adoption: the source goes (its ReplicaSet may have deleted it already)."""
    src, mid = state.source, state.machine_id
    op = state.source_op if state.deletion_requested else None
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    if op is None:
        if pod is None or (isinstance(pod, PodView) and (pod.uid != src.uid or pod.deleting)):
            return emit(SourceVanished(at=now, during="adopt").recorded(
                pod_facts(src.key, pod)))
        if isinstance(pod, ProbeError):
            return wait(now + seconds(1))
        return src_.start_source_op(
            src_.SourceOpKind.DELETE, src, obs, now, machine_id=mid,
            timeout=state.klass.timeouts.delete,
            reason=f"the restored pod {state.restore.plan.pod_name if state.restore else '?'} "
                   f"is owned by {owner}")
    if op.status is src_.SourceOpStatus.FAILED:
        assert op.failure is not None
        return _finish(state, now, MigrationPhase.FAILED, "SourceNotDeleted",
                       f"the restored pod runs on {state.final_node}, owned by {owner}, but "
                       f"the stopped source {src.key} could not be deleted: "
                       f"{op.failure.message}; its ReplicaSet scales it away as the "
                       "cheapest pod, or delete it", final_node=state.final_node)
    return src_.decide_source_op(op, src, obs, now, machine_id=mid)
