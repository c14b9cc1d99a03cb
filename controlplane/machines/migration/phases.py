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
- ``_stream_*`` (``transfer: stream``): the capture request (with ``capture-handoff``) and
  the restore pod (``restore-handoff``, labels parked) in one decision; the restore is
  verified only once the registry proved the artifact (gate 1) and lists the archives
  the target restored; then the frozen source is deleted. A failure before that wakes
  the source in place and removes the target pod: never two live copies.
- ``_lazy_*`` (mode ``lazy``): the same first decision with ``capture-mode`` lazy; the
  target is verified as soon as it runs (nothing is pushed), the source goes only once
  both ends reported every page (``PagesTransferred``). Before the target runs a failure
  wakes the source as a stream's does; after it, lost pages or the transfer deadline
  lose the workload (``WorkloadLost``): both pods are removed, the source never woken.
  A CRI-O target's pod names the hand-over's checkpoint image, which its agent pushes
  (:func:`~controlplane.machines.config.modes.lazy_checkpoint_images`).

Called by :class:`controlplane.machines.migration.machine.MigrationDecider`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Observation, PodView, ProbeError
from controlplane.machines.base.facts import merge_facts, pod_facts
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.stepping import Step, action_key, emit, failing, wait
from controlplane.machines.base.timing import REISSUE_AFTER, next_poll, seconds
from controlplane.machines.config.classes import OnFailure
from controlplane.machines.config.modes import lazy_checkpoint_images
from controlplane.machines.config.runtimes import RestorePath, restore_path
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import EventType, annotate_pod, emit_event
from controlplane.machines.migration.events import (
    Adopted,
    AdoptionAbandoned,
    AdoptionRequested,
    HandoffAbandoned,
    MigrationFinished,
    PagesTransferred,
    RollbackStarted,
    StreamDeclined,
    WorkloadLost,
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
from controlplane.machines.stages.capture import CaptureFailed, CaptureStatus
from controlplane.machines.stages.restore import RestorePlan, RestoreStatus
from controlplane.machines.stages.source import SourceVanished

_NOT_OBSERVED = ProbeError("NotObserved", "not observed")


def decide_migration(state: MigrationState, obs: Observation, now: datetime) -> Step:
    s = state.status
    if state.spec.lazy:
        if s is MigrationPhase.CHECKPOINTING:
            return _lazy_capture(state, obs, now)
        if s is MigrationPhase.TARGET_RUNNING:
            return _lazy_transfer(state, obs, now)
        if s is MigrationPhase.DELETING_SOURCE:
            return _lazy_retire_source(state, obs, now)
        if s is MigrationPhase.CLEARING_LOST:
            return _lazy_clear(state, obs, now)
    if s is MigrationPhase.CHECKPOINTING and state.streams:
        return _stream_capture(state, obs, now)
    if s is MigrationPhase.RESTORING and state.streams and not state.source_gone:
        return _stream_restore(state, obs, now)
    if s is MigrationPhase.DELETING_SOURCE and state.streams and state.restore is not None \
            and state.restore.status is RestoreStatus.VERIFIED:
        return _stream_retire_source(state, obs, now)
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
            message: str, *, final_node: str | None = None,
            facts: JsonObject | None = None) -> Step:
    c = state.spec.capture
    warning = phase not in (MigrationPhase.SUCCEEDED, MigrationPhase.CANCELLED)
    event = MigrationFinished(at=now, phase=phase.value, reason=reason, message=message,
                              final_node=final_node).recorded(facts or {})
    notice = emit_event(action_key(state.machine_id, "event", "finished"),
                        namespace=c.namespace, pod_name=c.name, pod_uid=c.uid,
                        type_=EventType.WARNING if warning else EventType.NORMAL,
                        reason=f"Migration{phase.value}", message=f"{reason}: {message}")
    return emit(event, actions=[notice])


def _unstick(state: MigrationState, obs: Observation, now: datetime) -> Step:
    failure = state.failure
    assert failure is not None
    removing = _remove_restore(state, obs, now, "the capture failed")
    if removing is not None:
        return removing
    since = state.capture.failed_at or state.started_at
    assert since is not None
    if behind_the_cluster(state):
        found = _found_restored(state, obs, now, since)
        if found is not None:
            return found
    result = src_.decide_unstick(
        state.source_op, state.source, obs, now, machine_id=state.machine_id,
        kill=state.klass.on_failure is OnFailure.KILL, timeout=state.klass.timeouts.release,
        since=since,
        reason=f"capture failed: {failure.reason}")
    if isinstance(result, Step):
        return result
    if state.spec.lazy:
        verdict = _lazy_verdict(state, obs, now)
        if verdict is not None:
            return verdict
    note = f"; source NOT unstuck: {result.note}" if result.note else ""
    return _finish(state, now, MigrationPhase.FAILED, failure.reason, failure.message + note,
                   final_node=None)


def behind_the_cluster(state: MigrationState) -> bool:
    """The capture failed because the source is gone, and this history started no restore:
    the cluster may be ahead of it (its database restored from a backup taken before the
    migration went on). Then the pods a restore of it would have made are looked for
    (:func:`restore_candidates`) before the migration is called failed."""
    failure = state.failure
    return (state.status is MigrationPhase.UNSTICKING and failure is not None
            and failure.reason == "SourceGone" and state.restore is None
            and not state.spec.lazy)


def restore_candidates(state: MigrationState) -> frozenset[str]:
    """Every pod key a restore of this migration is created as: each attempt's name (the
    target's attempts and a rollback's), the kept name, and the source's own name (a
    StatefulSet's successor takes it)."""
    c = state.spec.capture
    keys = {f"{c.namespace}/{rs_.restore_pod_name(state.spec.restore_name, state.machine_id, n)}"
            for n in range(1, state.klass.restore_attempts + 2)}
    if state.spec.keep_name:
        keys.add(state.spec.name_key)
    keys.add(c.pod_key)
    return frozenset(keys)


def _restored_by_this_migration(state: MigrationState, pod: PodView) -> bool:
    """``pod`` runs, restored by the agent from one of this migration's own attempts (its
    ``restore-key`` names this machine; the agent marked what it restored)."""
    key = pod.annotations.get(protocol.RESTORE_KEY, "")
    report = protocol.restore_report(pod)
    marked = bool(report.restored_from) or pod.annotations.get(
        protocol.RESTORED_FROM_HANDOFF, "") != ""
    return (key.startswith(f"{state.machine_id}/") and pod.uid != state.spec.capture.uid
            and pod.phase == "Running" and not pod.deleting and not report.failure
            and bool(report.instance_id) and marked)


def _found_restored(state: MigrationState, obs: Observation, now: datetime,
                    since: datetime) -> Step | None:
    """The workload found where a restore of this migration put it: the migration ends as
    the cluster says it did (``FoundRestored``), its steps in between unrecorded. A pod
    that could not be observed is waited for (gate 3) until the release deadline."""
    unseen = False
    for key in sorted(restore_candidates(state)):
        pod = obs.pods.get(key)  # not asked (None): an observation before this release
        unseen = unseen or isinstance(pod, ProbeError)
        if not (isinstance(pod, PodView) and _restored_by_this_migration(state, pod)):
            continue
        on_source = pod.node == state.spec.source_node
        phase = MigrationPhase.ROLLED_BACK if on_source else MigrationPhase.SUCCEEDED
        return _finish(state, now, phase, "FoundRestored",
                       f"workload found running on {pod.node} as pod {key}, restored by "
                       f"attempt {pod.annotations[protocol.RESTORE_KEY].split('/')[-1]} of "
                       "this migration: the cluster is ahead of this history (a database "
                       "restored from a backup?); the steps in between are not recorded",
                       final_node=pod.node, facts=pod_facts(key, pod))
    deadline = since + seconds(state.klass.timeouts.release)
    if unseen and now < deadline:
        return wait(deadline, next_poll(since, now))
    return None


def _wake(state: MigrationState, obs: Observation, now: datetime) -> Step:
    since = state.started_at
    assert since is not None
    removing = _remove_restore(state, obs, now, "the source is woken in place")
    if removing is not None:
        return removing
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
    if state.spec.lazy:
        verdict = _lazy_verdict(state, obs, now)
        if verdict is not None:
            return verdict
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


def _remove_restore(state: MigrationState, obs: Observation, now: datetime,
                    why: str) -> Step | None:
    """A restore beside the source (adoption, stream) not verified: take its pod away
    before the source is woken, so two copies never run (``None``: nothing to remove)."""
    r = state.restore
    if r is None or r.status in (RestoreStatus.CLEANED, RestoreStatus.VERIFIED):
        return None
    if r.in_flight:
        return rs_.abandon_restore(r, now, why)
    return rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)


def _stream_capture(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """Checkpointing with ``transfer: stream``: the agent dumps, pushes and hands off while
    the target's agent restores from the stream; both are watched."""
    assert state.started_at is not None
    r = state.restore
    if r is not None and not r.in_flight:
        return _handoff_failed(state, now)
    if r is None:
        return _stream_start(state, obs, now)
    capture = cap_.decide_capture(state.spec.capture, state.capture, obs, now,
                                  machine_id=state.machine_id, started_at=state.started_at,
                                  handoff_to=r.plan.node or state.target)
    if not capture.idle or capture.needs_tags:
        return capture
    # The registry has not proven the artifact yet: the restore is watched (its pod, a
    # failure, its deadline) but cannot be verified.
    restore = rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)
    if not restore.idle or restore.needs_tags:
        return restore
    return wait(capture.wake_at, restore.wake_at)


def _stream_start(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """The one decision that asks for the capture (handed off to the target) and creates
    the restore pod on the target, so no control-loop round trip sits between the dump
    and the restore. A target whose runtime restores images itself takes the registry."""
    not_agent = _target_not_by_agent(state, obs, now)
    if isinstance(not_agent, Step):
        return not_agent
    if not_agent:
        return emit(StreamDeclined(
            at=now, reason=f"{not_agent}, so it cannot take the agents' stream: the "
                           "checkpoint goes through the registry").recorded())
    return _capture_and_target(state, obs, now)


def _target_not_by_agent(state: MigrationState, obs: Observation,
                         now: datetime) -> Step | str:
    """Why the target node does not restore through its agent (``""``: it does), or a
    wait while it cannot be observed: the streamed and the lazy paths need the agent."""
    assert state.started_at is not None
    target = obs.nodes.get(state.target)
    if isinstance(target, ProbeError):
        return wait(now + rs_.PROBE_RETRY)
    path = restore_path(target.runtime if target is not None else "",
                        state.klass.runtime_paths())
    if path is RestorePath.AGENT:
        return ""
    how = f"restores through {path.value}" if isinstance(path, RestorePath) else \
        f"cannot restore ({path})"
    return f"node {state.target} {how}"


def _capture_and_target(state: MigrationState, obs: Observation, now: datetime, *,
                        images: Mapping[str, str] | None = None) -> Step:
    """The capture handed off to the target and the target pod, in one decision; with
    ``images`` (a lazy migration to CRI-O), the pod names those checkpoint images."""
    assert state.started_at is not None
    capture = cap_.decide_capture(state.spec.capture, state.capture, obs, now,
                                  machine_id=state.machine_id, started_at=state.started_at,
                                  handoff_to=state.target)
    if capture.idle or capture.confirm:
        return capture  # the source not observed (wait) or not capturable (fail)
    plan = _plan(state, state.target, None)
    if images:
        plan = replace(plan, path=RestorePath.RUNTIME.value, images=tuple(
            rs_.ContainerImage(c, ref) for c, ref in sorted(images.items())))
    start = rs_.start_restore(plan, state.context(), now, machine_id=state.machine_id)
    return Step(events=(*capture.events, *start.events),
                actions=(*capture.actions, *start.actions))


def _stream_restore(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """The artifact is verified (gate 1): the streamed restore is verified only if the
    manifest lists exactly the archives the target restored."""
    r = state.restore
    assert r is not None
    assert state.capture.digest is not None
    if not r.in_flight:
        return _handoff_failed(state, now)
    archives = protocol.archive_digests(
        {protocol.MANIFEST_ARCHIVE_DIGESTS: state.capture.archives})
    ctx = replace(state.context(), proof=rs_.HandoffProof(state.capture.digest, archives))
    return rs_.decide_restore(r, ctx, obs, now, machine_id=state.machine_id)


def _handoff_failed(state: MigrationState, now: datetime) -> Step:
    r = state.restore
    assert r is not None
    assert r.failure is not None
    return emit(HandoffAbandoned(
        at=now, reason="StreamedRestoreFailed",
        message=f"the restore on {r.plan.node} from the source's stream failed before it "
                f"was verified ({r.failure.reason}: {r.failure.message}); the capture "
                "request was withdrawn and the target pod removed").recorded())


def _lazy_capture(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """Checkpointing in mode ``lazy``: the source dumps all but memory and serves its
    pages; the target restores from the handoff. Bounded by the capture timeout."""
    assert state.started_at is not None
    r, c, cap = state.restore, state.spec.capture, state.capture
    if r is None:
        return _lazy_start(state, obs, now)
    source = obs.pods.get(c.pod_key, _NOT_OBSERVED)
    facts = merge_facts(pod_facts(c.pod_key, source),
                        pod_facts(r.plan.key, obs.pods.get(r.plan.key, _NOT_OBSERVED)))
    ours = isinstance(source, PodView) and source.uid == c.uid
    report = protocol.capture_report(source, c.checkpoint_id) \
        if isinstance(source, PodView) and ours else None
    if not r.in_flight:
        assert r.failure is not None
        handed = report is not None and (
            report.state is protocol.ReportState.TRANSFERRED or (
                report.state is protocol.ReportState.FAILED
                and report.reason.startswith(_PAGES_LOST)))
        if handed or _PAGES_LOST in r.failure.message:
            # The target's lazy-pages daemon had reached the page server: CRIU ended the
            # source when that connection ended, so there is nothing left to wake.
            return _lost(state, now, "PagesLost", f"the restore on {r.plan.node} failed "
                         f"after it began fetching pages ({r.failure.reason}: "
                         f"{r.failure.message})", facts)
        return _handoff_failed(state, now)
    assert cap.deadline is not None
    if report is not None and report.state is protocol.ReportState.FAILED and \
            report.reason.startswith(_PAGES_LOST):
        return _lost(state, now, "PagesLost", f"the source's agent reported {report.reason}",
                     facts)
    capture = Step()
    if report is None or report.state is not protocol.ReportState.TRANSFERRED:
        gone = source is None or (isinstance(source, PodView) and (
            not ours or source.deleting or source.phase in ("Succeeded", "Failed")))
        if gone:
            return failing(CaptureFailed(
                at=now, reason="SourceGone", message=f"source pod {c.pod_key} went away "
                "before the target ran").recorded(facts))
        if now >= cap.deadline:
            return failing(CaptureFailed(
                at=now, reason="Timeout", message=f"the target did not run from the lazy "
                f"handoff within {c.timeout}s (the class's capture timeout)").recorded(facts))
        capture = cap_.decide_capture(c, cap, obs, now, machine_id=state.machine_id,
                                      started_at=state.started_at,
                                      handoff_to=r.plan.node or state.target)
        if not capture.idle or capture.needs_tags:
            return capture
    restore = rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)
    if not restore.idle or restore.needs_tags:
        return restore
    return wait(capture.wake_at, restore.wake_at, cap.deadline)


def _lazy_verdict(state: MigrationState, obs: Observation, now: datetime) -> Step | None:
    """(lazy) The request is withdrawn: the source's agent says whether that aborted the
    dump (``Failed: Withdrawn``, the same process runs on) or came too late (the target's
    daemon had reached the page server: ``Failed: PagesLost``, the workload is gone).
    Waited for up to the release timeout (``None``: the source runs on, as said)."""
    c = state.spec.capture
    if state.restore is None:
        return None  # no target was ever created: nothing could fetch a page
    source = obs.pods.get(c.pod_key, _NOT_OBSERVED)
    facts = pod_facts(c.pod_key, source)
    report = protocol.capture_report(source, c.checkpoint_id) \
        if isinstance(source, PodView) and source.uid == c.uid else None
    if report is not None and (report.state is protocol.ReportState.TRANSFERRED or (
            report.state is protocol.ReportState.FAILED
            and report.reason.startswith(_PAGES_LOST))):
        return _lost(state, now, "PagesLost", "the target's lazy-pages daemon had reached the "
                     "source before the migration was abandoned (the source's agent reported "
                     f"{report.reason or report.state.value})", facts)
    if report is not None and report.state is protocol.ReportState.FAILED:
        return None
    op = state.source_op
    since = op.issued_at if op is not None and op.issued_at is not None else now
    deadline = since + seconds(state.klass.timeouts.release)
    if isinstance(source, PodView) and source.uid == c.uid and now < deadline:
        return wait(deadline)
    return None


def _lazy_start(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """The capture (mode lazy, handed off to the target) and the target pod, in one
    decision. A target that does not restore through its agent cannot take the pages
    (refused at submission; a node that changed since ends here, nothing asked)."""
    not_agent = _target_not_by_agent(state, obs, now)
    if isinstance(not_agent, Step):
        return not_agent
    target = obs.nodes.get(state.target)
    if not_agent and not isinstance(target, ProbeError) and target is not None and \
            restore_path(target.runtime, state.klass.runtime_paths()) is RestorePath.RUNTIME:
        # CRI-O restores the hand-over's checkpoint image, which the target's agent pushes
        # where the pod names it (docs/runtime.md, lazy pages on real nodes).
        c = state.spec.capture
        names = c.containers or _template_containers(state.spec.template)
        return _capture_and_target(state, obs, now, images=lazy_checkpoint_images(
            c.artifact, c.checkpoint_id, names))
    if not_agent:
        return _finish(state, now, MigrationPhase.FAILED, "LazyRefused",
                       f"{not_agent}, so it cannot fetch lazy pages; nothing was asked of "
                       "the source: migrate with mode 'stop-and-copy'",
                       final_node=state.spec.source_node)
    return _capture_and_target(state, obs, now)


def _template_containers(template: JsonObject) -> tuple[str, ...]:
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list):
        return ()
    return tuple(str(c.get("name")) for c in containers if isinstance(c, dict))


#: How the agents name a lost transfer (``report-reason``, ``restore-failure``).
_PAGES_LOST = "PagesLost"


def _lazy_transfer(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """TargetRunning: the target runs, its pages arriving. ``PagesTransferred`` needs the
    source's ``Transferred`` with ``report-pages`` and the target's ``pages-received``
    with every page it expected; a loss on either side, or the transfer deadline (the
    class's restore timeout from the target running), loses the workload."""
    r, c = state.restore, state.spec.capture
    assert r is not None
    assert state.transfer_deadline is not None
    source = obs.pods.get(c.pod_key, _NOT_OBSERVED)
    target = obs.pods.get(r.plan.key, _NOT_OBSERVED)
    facts = merge_facts(pod_facts(c.pod_key, source), pod_facts(r.plan.key, target))
    served: protocol.PagesCount | None = None
    source_gone = source is None or (isinstance(source, PodView) and source.uid != c.uid)
    if isinstance(source, PodView) and not source_gone:
        report = protocol.capture_report(source, c.checkpoint_id)
        if report is not None and report.state is protocol.ReportState.FAILED:
            return _lost(state, now, "PagesLost",
                         f"the source's agent reported {report.reason or 'a failure'}", facts)
        if report is not None and report.state is protocol.ReportState.TRANSFERRED:
            try:
                served = protocol.pages_served(source.annotations, c.checkpoint_id)
            except ValueError:
                served = None  # unreadable: the deadline decides
    arrived: protocol.PagesCount | None = None
    if target is None or (isinstance(target, PodView) and (
            target.uid != r.uid or target.deleting or target.phase in ("Failed", "Succeeded"))):
        return _lost(state, now, "TargetLost", f"the restored pod {r.plan.key} went away or "
                     "exited before its pages all arrived", facts)
    if isinstance(target, PodView):
        failure = protocol.restore_report(target).failure
        if failure:
            return _lost(state, now, "PagesLost" if failure.startswith(_PAGES_LOST)
                         else "TargetFailed", f"the target's agent reported {failure}", facts)
        try:
            arrived = protocol.pages_arrived(target.annotations, c.checkpoint_id)
        except ValueError:
            arrived = None
        if arrived is not None and arrived.pages != arrived.expected:
            return _lost(state, now, "PagesMissing", f"the target received {arrived.pages} "
                         f"of the {arrived.expected} pages it expected", facts)
    if arrived is not None and (served is not None or source_gone):
        return emit(PagesTransferred(
            at=now, pages=arrived.pages, bytes=served.bytes if served else None,
            seconds=served.seconds if served else None).recorded(facts))
    if now >= state.transfer_deadline:
        return _lost(state, now, "TransferTimeout",
                     f"not every page reached {state.target} within "
                     f"{state.klass.timeouts.restore}s of the target running (the class's "
                     "restore timeout)", facts)
    return wait(state.transfer_deadline)


def _lost(state: MigrationState, now: datetime, reason: str, detail: str,
          facts: JsonObject) -> Step:
    """The target ran and the pages stopped: the workload is gone. The restore is failed
    so its pod is removed; what is left of the source is deleted next, never woken."""
    r = state.restore
    assert r is not None
    lost = WorkloadLost(
        at=now, reason="WorkloadLost",
        message=f"the source's pages stopped before the target had them all; the workload "
                f"is gone: {reason}: {detail}. Nothing was kept in the registry (lazy); "
                "restore it from an earlier checkpoint, or start it anew").recorded(facts)
    events = [lost]
    if r.status in (RestoreStatus.VERIFIED, RestoreStatus.CREATING, RestoreStatus.STARTING):
        events.append(rs_.RestoreFailed(at=now, attempt=r.plan.attempt, reason=reason,
                                        message=detail).recorded())
    return failing(*events)


def _lazy_clear(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """ClearingLostWorkload: the target pod is removed, then the source pod deleted
    (what CRIU left of it), then Failed: WorkloadLost."""
    r, src = state.restore, state.source
    assert r is not None
    assert state.failure is not None
    if r.status is not RestoreStatus.CLEANED:
        return rs_.decide_restore(r, state.context(), obs, now, machine_id=state.machine_id)
    note = ""
    op = state.source_op if state.deletion_requested else None
    if not state.source_gone:
        if op is None:
            pod = obs.pods.get(src.key, _NOT_OBSERVED)
            if pod is None or (isinstance(pod, PodView) and (pod.uid != src.uid or
                                                              pod.deleting)):
                return emit(SourceVanished(at=now, during="lost").recorded(
                    pod_facts(src.key, pod)))
            if isinstance(pod, ProbeError):
                return wait(now + seconds(1))
            return src_.start_source_op(
                src_.SourceOpKind.DELETE, src, obs, now, machine_id=state.machine_id,
                timeout=state.klass.timeouts.delete, reason="the workload was lost in a lazy "
                "migration: removing what is left of the source")
        if op.status is src_.SourceOpStatus.ISSUED:
            return src_.decide_source_op(op, src, obs, now, machine_id=state.machine_id)
        if op.failure is not None:
            note = f"; the source pod {src.key} could not be deleted: {op.failure.message}"
    return _finish(state, now, MigrationPhase.FAILED, state.failure.reason,
                   state.failure.message + note)


def _lazy_retire_source(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """Every page arrived: delete the source pod (its process already ended), then give
    the restored pod its labels back and end Succeeded (no artifact to collect)."""
    r, src = state.restore, state.source
    assert r is not None
    assert r.uid is not None
    op = state.source_op if state.deletion_requested else None
    if state.source_gone:
        # Only now the labels: a ReplicaSet never sees two pods it would scale one away of.
        done = _finish(state, now, MigrationPhase.SUCCEEDED, "Migrated",
                       f"workload running on {state.final_node}; every page arrived lazily "
                       "(no checkpoint kept: no memory was pushed)", final_node=state.final_node)
        labels = template_labels(state.spec.template)
        if not labels:
            return done
        handback = annotate_pod(action_key(state.machine_id, "lazy", "labels"),
                                namespace=r.plan.namespace, name=r.plan.pod_name, uid=r.uid,
                                annotations={}, labels=labels)
        return replace(done, actions=(handback, *done.actions))
    if op is not None and op.failure is not None:
        return _finish(state, now, MigrationPhase.FAILED, "SourceNotDeleted",
                       f"the restored pod {r.plan.key} runs on {state.final_node} with every "
                       f"page, but what is left of the source {src.key} was not deleted: "
                       f"{op.failure.message}; delete it", final_node=state.final_node)
    if op is not None:
        return src_.decide_source_op(op, src, obs, now, machine_id=state.machine_id)
    pod = obs.pods.get(src.key, _NOT_OBSERVED)
    if pod is None or (isinstance(pod, PodView) and (pod.uid != src.uid or pod.deleting)):
        return emit(SourceVanished(at=now, during="delete").recorded(pod_facts(src.key, pod)))
    if isinstance(pod, ProbeError):
        return wait(now + seconds(1))
    return src_.start_source_op(
        src_.SourceOpKind.DELETE, src, obs, now, machine_id=state.machine_id,
        timeout=state.klass.timeouts.delete, reason=f"every page reached {state.final_node}")


def _stream_retire_source(state: MigrationState, obs: Observation, now: datetime) -> Step:
    """The target runs verified: delete the frozen source (gate 1 re-checked in this very
    observation by the deletion step), and give the restored bare pod its labels back.
    A delete that cannot be done ends Failed with the source left frozen, never woken
    beside the running target."""
    r = state.restore
    assert r is not None
    assert r.uid is not None
    op = state.source_op if state.deletion_requested else None
    failure = state.abort or (op.failure if op is not None else None)
    if failure is not None:
        return _finish(state, now, MigrationPhase.FAILED, "SourceNotDeleted",
                       f"the restored pod {r.plan.key} runs verified on {state.final_node}, "
                       f"but the frozen source {state.spec.capture.pod_key} was not deleted: "
                       f"{failure.message}; delete it (the target holds its state)",
                       final_node=state.final_node)
    step = _delete_source(state, obs, now)
    labels = template_labels(state.spec.template)
    if op is None and step.actions and labels:
        handback = annotate_pod(action_key(state.machine_id, "stream", "labels"),
                                namespace=r.plan.namespace, name=r.plan.pod_name, uid=r.uid,
                                annotations={}, labels=labels)
        step = replace(step, actions=(*step.actions, handback))
    return step


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
    streamed = state.streams and not state.source_gone  # from the source's agent
    if state.spec.claims:  # the StatefulSet's successor: its name, claimed, not created
        name = c.name
    return RestorePlan(
        attempt=attempt, namespace=c.namespace,
        pod_name=name or rs_.restore_pod_name(state.spec.restore_name, state.machine_id,
                                              attempt),
        node=node, artifact=None if streamed else state.pinned, checkpoint_id=c.checkpoint_id,
        not_fresh=(state.capture.source_instance,) if state.capture.source_instance else (),
        claim_from=c.uid if state.spec.claims else "",
        handoff_source=c.pod_key if streamed else "", handoff_uid=c.uid if streamed else "",
        lazy=streamed and state.spec.lazy)


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
