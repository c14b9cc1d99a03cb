"""The restore step: create a pod from a saved template and prove it restored.

Shared by the restore, migration and resume machines. One attempt, status flow::

    (start) --RestorePodRequested--> Creating --RestorePodObserved--> Starting
        Creating/Starting --RestoreVerified--> Verified
        Creating/Starting --RestoreFailed--> Failed
        Failed --RestoredPodDeletionRequested--> Cleaning --RestoreCleanedUp--> Cleaned

- The pod gets a deterministic name, REQUIRED node affinity to the target (the driver
  never sets ``nodeName``, so capacity and cordons are respected), the restore annotation
  naming the artifact by digest, and ``restore-key`` marking it as this attempt's pod. A
  same-named pod without that key is never adopted; once our pod's UID is known, a pod
  with another UID is not ours either (gate 4).
- ``RestoreVerified`` needs the pod Running and the agent's report: restored from exactly
  this digest, with an instance id that is fresh (not the source's, not an earlier
  attempt's). A cold boot (no artifact) is verified by Running alone. A restore from the
  source agent's stream (``handoff_source``) also needs the owner's proof that the
  registry holds this checkpoint (gate 1) and lists exactly the archives the target
  marked in ``restored-from-handoff``; archives that differ fail the attempt. A lazy
  handoff (``lazy``) has no registry copy: running fresh and marked is verified.
- ``TargetUnschedulable`` is reported once (with a Warning) when the target node is
  missing, cordoned or NotReady; the attempt fails at the scheduling deadline.
- A failed attempt deletes its own pod (UID precondition) before the owner moves on.

Pure.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from controlplane.engine.decider import Action
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Observation, PodFact, PodView, ProbeError
from controlplane.machines.base.codec import OMIT_DEFAULT, RawJson
from controlplane.machines.base.events import ActionFailed, DomainEvent
from controlplane.machines.base.facts import merge_facts, node_facts, node_problem, pod_facts
from controlplane.machines.base.failures import ActionError, Failure
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.stepping import Step, action_key, emit, failing, need, wait
from controlplane.machines.base.timing import REISSUE_AFTER, next_poll, seconds
from controlplane.machines.config.runtimes import RestorePath, restore_path
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import (
    EventType,
    claim_pod,
    create_pod,
    delete_pod,
    emit_event,
)

SUPERSEDED = "Superseded"  # failure reason of an attempt abandoned by retarget/cancel
_NOT_OBSERVED = ProbeError("NotObserved", "the pod was not observed")
_SUFFIX = re.compile(r"-r[0-9a-f]{6}-[0-9]+$")


class RestoreStatus(StrEnum):
    CREATING = "Creating"
    STARTING = "Starting"
    VERIFIED = "Verified"
    FAILED = "Failed"
    CLEANING = "Cleaning"
    CLEANED = "Cleaned"


@dataclass(frozen=True)
class RestoreContext:
    """What every attempt of one machine shares (not stored per attempt)."""

    template: RawJson
    loader: str | None
    schedule_timeout: int
    restore_timeout: int
    cleanup_timeout: int
    unseal: str = ""  # where the key that unseals a sealed class's layers is
    #: A streamed restore's proof, once the owner has it: the verified artifact's digest
    #: and the archives its manifest lists (``None``: not proven yet, never verified).
    proof: HandoffProof | None = None


@dataclass(frozen=True)
class HandoffProof:
    """What the registry proved of a handed-off checkpoint (gate 1)."""

    digest: str
    archives: Mapping[str, str]


@dataclass(frozen=True)
class ContainerImage:
    """A container of the restore pod and the checkpoint image its runtime restores it from."""

    container: str
    image: str  # registry/repo@sha256:...


@dataclass(frozen=True)
class RestorePlan:
    """One attempt: where, from what, under which name."""

    attempt: int
    namespace: str
    pod_name: str
    node: str | None
    artifact: str | None  # registry/repo@sha256:...; None is a cold boot
    checkpoint_id: str | None = None
    not_fresh: tuple[str, ...] = ()  # instance ids that do not prove a fresh restore
    #: Claim mode (a StatefulSet's pod): the pod is not created but the controller's own
    #: successor of the source (this UID) is claimed: gated, same name, another UID.
    claim_from: str = field(default="", metadata=OMIT_DEFAULT)
    #: How the target restores (:mod:`controlplane.machines.config.runtimes`): ``agent``,
    #: or ``cri-o`` with the per-container checkpoint images the pod is created with.
    path: str = field(default=RestorePath.AGENT.value, metadata=OMIT_DEFAULT)
    images: tuple[ContainerImage, ...] = field(default=(), metadata=OMIT_DEFAULT)
    #: A restore from the source agent's stream: the source pod (``namespace/name``) and
    #: its UID; ``artifact`` is then ``None`` (not yet proven) and this is no cold boot.
    handoff_source: str = field(default="", metadata=OMIT_DEFAULT)
    handoff_uid: str = field(default="", metadata=OMIT_DEFAULT)
    #: A lazy (post-copy) handoff: no registry copy exists, so the pod is verified as soon
    #: as it runs fresh and marked ``restored-from-handoff`` for this checkpoint (its
    #: pages still arriving: the owner watches ``pages-received``).
    lazy: bool = field(default=False, metadata=OMIT_DEFAULT)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    @property
    def digest(self) -> str | None:
        return None if self.artifact is None else self.artifact.split("@", 1)[1]


@dataclass(frozen=True)
class Restore:
    plan: RestorePlan
    issued_at: datetime
    schedule_deadline: datetime
    deadline: datetime
    status: RestoreStatus = RestoreStatus.CREATING
    create_attempt: int = 1
    uid: str | None = None
    node: str | None = None
    instance_id: str | None = None
    unschedulable: str | None = None
    failure: Failure | None = None
    cleanup_attempt: int = 0
    cleanup_uid: str | None = None
    cleanup_issued_at: datetime | None = None
    cleanup_deadline: datetime | None = None
    action_error: ActionError | None = None

    @property
    def in_flight(self) -> bool:
        return self.status in (RestoreStatus.CREATING, RestoreStatus.STARTING)

    @property
    def superseded(self) -> bool:
        return self.failure is not None and self.failure.reason == SUPERSEDED


@dataclass(frozen=True)
class RestorePodRequested(DomainEvent):
    """The attempt's pod was created. The first create of an attempt carries its ``plan``,
    ``mode`` and deadlines; a re-create only ``create_attempt``."""

    at: datetime
    attempt: int
    create_attempt: int
    plan: RestorePlan | None = None
    mode: str | None = None
    schedule_deadline: datetime | None = None
    deadline: datetime | None = None


@dataclass(frozen=True)
class RestorePodObserved(DomainEvent):
    at: datetime
    attempt: int
    uid: str
    node: str | None


@dataclass(frozen=True)
class TargetUnschedulable(DomainEvent):
    at: datetime
    attempt: int
    problem: str


@dataclass(frozen=True)
class RestoreVerified(DomainEvent):
    """The agent restored a fresh instance from the planned digest (or cold-booted)."""

    at: datetime
    attempt: int
    uid: str
    node: str | None
    digest: str | None
    instance_id: str


@dataclass(frozen=True)
class RestoreFailed(DomainEvent):
    at: datetime
    attempt: int
    reason: str
    message: str


@dataclass(frozen=True)
class RestoredPodDeletionRequested(DomainEvent):
    """A failed attempt's pod is deleted. The first request carries the pod's ``uid`` and
    the ``deadline``; a reissue only ``cleanup_attempt``."""

    at: datetime
    attempt: int
    cleanup_attempt: int
    uid: str | None = None
    deadline: datetime | None = None


@dataclass(frozen=True)
class RestoreCleanedUp(DomainEvent):
    at: datetime
    attempt: int
    how: str


RestoreAttemptEvent = (RestorePodRequested | RestorePodObserved | TargetUnschedulable
                       | RestoreVerified | RestoreFailed | RestoredPodDeletionRequested
                       | RestoreCleanedUp)
#: The restore step's events, for the sets of the kinds that compose it.
RESTORE_EVENTS: tuple[type[DomainEvent], ...] = (
    RestorePodRequested, RestorePodObserved, TargetUnschedulable, RestoreVerified,
    RestoreFailed, RestoredPodDeletionRequested, RestoreCleanedUp)


def restore_pod_name(base: str, machine_id: str, attempt: int) -> str:
    """A deterministic, DNS-safe name: ``<base>-r<hash of machine id>-<attempt>``.

    A suffix left by an earlier migration is replaced, so names do not grow.
    """
    stem = _SUFFIX.sub("", base)
    tag = hashlib.sha256(machine_id.encode()).hexdigest()[:6]
    suffix = f"-r{tag}-{attempt}"
    return stem[: 63 - len(suffix)].rstrip("-.") + suffix


def create_key(machine_id: str, attempt: int, create_attempt: int) -> str:
    return action_key(machine_id, "restore", attempt, "create", create_attempt)


def cleanup_key(machine_id: str, attempt: int, cleanup_attempt: int) -> str:
    return action_key(machine_id, "restore", attempt, "cleanup", cleanup_attempt)


def restore_key(machine_id: str, attempt: int) -> str:
    """The value of the ``restore-key`` annotation marking this attempt's pod."""
    return f"{machine_id}/{attempt}"


def runtime_plan(plan: RestorePlan, obs: Observation, now: datetime,
                 overrides: Mapping[str, str] | None = None) -> RestorePlan | Step:
    """``plan`` with the target's restore path (and, on CRI-O, the checkpoint image of each
    container), or the step that looks up what that needs first (the artifact's manifest;
    the node must be among the machine's interests, or a wait while it cannot be read).

    A target that cannot restore (containerd, an unknown runtime) or an artifact CRI-O
    cannot restore keeps the plan with ``path`` set to the reason: :func:`start_restore`
    then fails the attempt at once, naming it, instead of creating a pod."""
    if plan.artifact is None or plan.node is None:
        return plan  # a cold boot, or no node chosen: the agent path (nothing to name)
    # A node the owner did not ask for, or one that does not exist, reports no runtime:
    # the agent path (a missing node fails the attempt at its scheduling deadline).
    node = obs.nodes.get(plan.node)
    if isinstance(node, ProbeError):
        return wait(now + PROBE_RETRY)
    runtime = node.runtime if node is not None else ""
    path = restore_path(runtime, overrides)
    if path is RestorePath.AGENT:
        return replace(plan, path=path.value, images=())
    if not isinstance(path, RestorePath):
        return replace(plan, path=f"{_REFUSED}node {plan.node} cannot restore: {path}")
    if plan.artifact not in obs.tags:
        return need(plan.artifact)
    tag = obs.tags[plan.artifact]
    if isinstance(tag, ProbeError):
        return wait(now + PROBE_RETRY)
    images = protocol.container_images(tag.annotations if tag is not None else {})
    if not images:
        return replace(plan, path=f"{_REFUSED}node {plan.node} runs {runtime}, which restores "
                       "only checkpoint images the kubelet and CRI-O captured; artifact "
                       f"{plan.artifact} lists none (it was captured by the node agent)")
    refs = protocol.container_image_refs(plan.artifact, images)
    return replace(plan, path=path.value,
                   images=tuple(ContainerImage(c, ref) for c, ref in sorted(refs.items())))


#: How soon a node or manifest that could not be read is read again.
PROBE_RETRY = seconds(2)
#: The prefix of a plan's ``path`` that says why its target cannot restore.
_REFUSED = "refused: "


def start_restore(plan: RestorePlan, ctx: RestoreContext, now: datetime, *,
                  machine_id: str, facts: JsonObject | None = None) -> Step:
    """Create the attempt's pod (in claim mode: wait for the controller's, to claim it).
    A plan whose target cannot restore fails at once (see :func:`runtime_plan`)."""
    if plan.path.startswith(_REFUSED):
        requested = RestorePodRequested(
            at=now, attempt=plan.attempt, create_attempt=0, plan=plan, mode="refused",
            schedule_deadline=now, deadline=now).recorded(facts)
        refused = RestoreFailed(at=now, attempt=plan.attempt, reason="RuntimeCannotRestore",
                                message=plan.path.removeprefix(_REFUSED)).recorded(facts)
        return failing(requested, refused)
    claim = bool(plan.claim_from)
    mode = "claim" if claim else "handoff" if plan.handoff_source else \
        "cold-boot" if plan.artifact is None else "restore"
    event = RestorePodRequested(
        at=now, attempt=plan.attempt, create_attempt=0 if claim else 1, plan=plan,
        mode=mode, schedule_deadline=now + seconds(ctx.schedule_timeout),
        deadline=now + seconds(ctx.restore_timeout)).recorded(facts)
    return emit(event, actions=[] if claim else [_create(plan, ctx, machine_id, 1)])


def abandon_restore(restore: Restore, now: datetime, why: str) -> Step:
    """Give up an attempt in flight (retarget, cancel); its pod is then cleaned up."""
    return emit(RestoreFailed(at=now, attempt=restore.plan.attempt, reason=SUPERSEDED,
                              message=why).recorded())


def decide_restore(r: Restore, ctx: RestoreContext, obs: Observation, now: datetime, *,
                   machine_id: str) -> Step:
    """The attempt's next step; idle steps carry the wake time."""
    pod = obs.pods.get(r.plan.key, _NOT_OBSERVED)
    if r.in_flight:
        return _watch(r, ctx, pod, obs, now, machine_id)
    if r.status is RestoreStatus.FAILED:
        return _start_cleanup(r, ctx, pod, now, machine_id)
    if r.status is RestoreStatus.CLEANING:
        return _cleanup(r, pod, now, machine_id)
    return Step()


def _ours(r: Restore, pod: PodView, machine_id: str) -> bool:
    return pod.annotations.get(protocol.RESTORE_KEY) == restore_key(machine_id, r.plan.attempt)


def _watch(r: Restore, ctx: RestoreContext, pod: PodFact, obs: Observation, now: datetime,
           machine_id: str) -> Step:
    plan = r.plan
    node_fact = obs.nodes.get(plan.node, _NOT_OBSERVED) if plan.node else None
    facts = merge_facts(pod_facts(plan.key, pod),
                        node_facts(plan.node, node_fact) if plan.node else {})
    if r.action_error is not None:
        return _fail(r, now, "CreateRejected", r.action_error.message,
                     merge_facts(facts, r.action_error.facts()))
    if plan.claim_from and r.uid is None:
        claimed = _claim(r, ctx, pod, now, machine_id, facts)
        if claimed is not None:
            return claimed
    if isinstance(pod, PodView):
        verdict = _judge(r, ctx, pod, now, facts, machine_id)
        if verdict is not None:
            return verdict
    elif pod is None and r.uid is not None:
        return _fail(r, now, "RestoredPodVanished", f"restored pod {plan.key} disappeared", facts)
    elif pod is None and now >= r.issued_at + REISSUE_AFTER and now < r.deadline:
        attempt = r.create_attempt + 1
        event = RestorePodRequested(at=now, attempt=plan.attempt,
                                    create_attempt=attempt).recorded(facts)
        return emit(event, actions=[_create(plan, ctx, machine_id, attempt)])
    scheduled = isinstance(pod, PodView) and pod.node is not None
    problem = node_problem(node_fact) if plan.node else None
    if problem is not None and r.unschedulable is None and not scheduled:
        warning = emit_event(action_key(machine_id, "event", "unschedulable", plan.attempt),
                             namespace=plan.namespace, pod_name=plan.pod_name, pod_uid=r.uid,
                             type_=EventType.WARNING, reason="TargetUnschedulable",
                             message=f"restore target {plan.node}: {problem}")
        return emit(TargetUnschedulable(at=now, attempt=plan.attempt,
                                        problem=problem).recorded(facts),
                    actions=[warning])
    if not scheduled and now >= r.schedule_deadline:
        why = r.unschedulable or problem or "no node took the pod"
        return _fail(r, now, "Unschedulable",
                     f"restored pod not scheduled on {plan.node or 'any node'} in "
                     f"{ctx.schedule_timeout}s: {why}", facts)
    if now >= r.deadline:
        return _fail(r, now, "Timeout", f"restore not proven within {ctx.restore_timeout}s",
                     facts)
    return wait(r.deadline, None if scheduled else r.schedule_deadline,
                next_poll(r.issued_at, now) if r.uid is None else None)


def _claim(r: Restore, ctx: RestoreContext, pod: PodFact, now: datetime, machine_id: str,
           facts: JsonObject) -> Step | None:
    """Claim mode, before the pod is ours: wait for the controller's successor, claim it
    when it carries the gate (again after ``REISSUE_AFTER`` if the claim is not seen),
    fail when it came without the gate (it would start without the state). ``None``:
    the pod is ours, go on as for a created one."""
    plan = r.plan
    if isinstance(pod, PodView) and _ours(r, pod, machine_id):
        return None
    if isinstance(pod, PodView) and pod.uid != plan.claim_from and not pod.deleting:
        if protocol.RESTORE_GATE not in pod.gates:
            return _fail(r, now, "SuccessorNotGated", f"its controller recreated {plan.key} "
                         f"(uid {pod.uid}) without the {protocol.RESTORE_GATE} scheduling "
                         "gate, so it starts without the checkpointed state: is the "
                         "control plane's admission webhook installed (docs/webhook.md)? "
                         "The pod is left alone", facts)
        if r.create_attempt == 0 or now >= r.issued_at + REISSUE_AFTER:
            attempt = r.create_attempt + 1
            event = RestorePodRequested(at=now, attempt=plan.attempt,
                                        create_attempt=attempt).recorded(facts)
            return emit(event, actions=[_claim_action(plan, ctx, pod.uid, machine_id,
                                                      attempt)])
        return wait(r.deadline, r.issued_at + REISSUE_AFTER)
    if not isinstance(pod, ProbeError) and now >= r.schedule_deadline:
        return _fail(r, now, "SuccessorNotCreated", f"its controller did not recreate "
                     f"{plan.key} within {ctx.schedule_timeout}s", facts)
    return wait(r.deadline, r.schedule_deadline, next_poll(r.issued_at, now))


def _claim_action(plan: RestorePlan, ctx: RestoreContext, uid: str, machine_id: str,
                  attempt: int) -> Action:
    annotations = protocol.restore_request(
        artifact=plan.artifact, restore_key=restore_key(machine_id, plan.attempt),
        checkpoint_id=plan.checkpoint_id, loader=ctx.loader, unseal=ctx.unseal)
    return claim_pod(create_key(machine_id, plan.attempt, attempt), namespace=plan.namespace,
                     name=plan.pod_name, uid=uid, node=plan.node, annotations=annotations,
                     gate=protocol.RESTORE_GATE, images=_images(plan))


def _judge(r: Restore, ctx: RestoreContext, pod: PodView, now: datetime, facts: JsonObject,
           machine_id: str) -> Step | None:
    plan = r.plan
    if not _ours(r, pod, machine_id) or (r.uid is not None and pod.uid != r.uid):
        if r.uid is None:
            return _fail(r, now, "NameConflict", f"pod {plan.key} exists and was not created "
                         "by this restore; it is left alone", facts)
        return _fail(r, now, "RestoredPodReplaced",
                     f"restored pod {plan.key} was replaced (uid {pod.uid}, ours {r.uid})", facts)
    if r.uid is None:
        return emit(RestorePodObserved(at=now, attempt=plan.attempt, uid=pod.uid,
                                       node=pod.node).recorded(facts))
    report = protocol.restore_report(pod)
    if report.failure:
        return _fail(r, now, "AgentRestoreFailed", f"the node agent reported: {report.failure}",
                     facts)
    if pod.phase in ("Failed", "Succeeded") or pod.deleting:
        return _fail(r, now, "RestoredPodExited", f"restored pod is {pod.phase}"
                     + (" and terminating" if pod.deleting else ""), facts)
    if plan.node is not None and pod.node is not None and pod.node != plan.node:
        return _fail(r, now, "WrongNode", f"restored pod ran on {pod.node}, not {plan.node}",
                     facts)
    wrong = report.restored_from and report.restored_from != plan.digest
    if plan.artifact is not None and wrong:
        return _fail(r, now, "WrongArtifact", f"the agent restored {report.restored_from}, "
                     f"not {plan.digest}", facts)
    if pod.phase != "Running":
        return None
    fresh = bool(report.instance_id) and report.instance_id not in plan.not_fresh
    if plan.handoff_source:
        return _judge_handoff(r, pod, ctx, fresh, now, facts)
    if plan.artifact is None or (report.restored_from == plan.digest and fresh):
        return emit(RestoreVerified(
            at=now, attempt=plan.attempt, uid=pod.uid, node=pod.node, digest=plan.digest,
            instance_id=report.instance_id).recorded(facts))
    return None


def _judge_handoff(r: Restore, pod: PodView, ctx: RestoreContext, fresh: bool, now: datetime,
                   facts: JsonObject) -> Step | None:
    """A streamed restore runs: verified only with the registry's proof and equal archives."""
    plan = r.plan
    try:
        marked = protocol.handoff_restored(pod.annotations)
    except ValueError as exc:
        return _fail(r, now, "HandoffUnreadable", str(exc), facts)
    if plan.lazy and marked is not None and marked[0] == plan.checkpoint_id and fresh:
        # Nothing was pushed: the target running fresh from this checkpoint's handoff is
        # all there is to verify; its pages are still on their way (the owner's watch).
        return emit(RestoreVerified(
            at=now, attempt=plan.attempt, uid=pod.uid, node=pod.node, digest=None,
            instance_id=protocol.restore_report(pod).instance_id).recorded(facts))
    if marked is None or marked[0] != plan.checkpoint_id or not fresh or ctx.proof is None:
        return None  # the agent has not marked it yet, or the registry has not proven it
    checkpoint, archives = marked
    if archives != dict(ctx.proof.archives):
        listed = protocol.format_archive_digests(ctx.proof.archives) \
            if ctx.proof.archives else "no archive-digests"
        return _fail(r, now, "HandoffMismatch",
                     f"the target restored archives {protocol.format_archive_digests(archives)} "
                     f"of checkpoint {checkpoint}, but the registry's manifest "
                     f"{ctx.proof.digest} lists {listed}: what runs is not what the "
                     "registry holds", facts)
    report = protocol.restore_report(pod)
    return emit(RestoreVerified(at=now, attempt=plan.attempt, uid=pod.uid, node=pod.node,
                                digest=ctx.proof.digest,
                                instance_id=report.instance_id).recorded(facts))


def _fail(r: Restore, now: datetime, reason: str, message: str, facts: JsonObject) -> Step:
    return failing(RestoreFailed(at=now, attempt=r.plan.attempt, reason=reason,
                                 message=message).recorded(facts))


def _start_cleanup(r: Restore, ctx: RestoreContext, pod: PodFact, now: datetime,
                   machine_id: str) -> Step:
    plan = r.plan
    facts = pod_facts(plan.key, pod)
    if isinstance(pod, ProbeError):
        if now >= r.issued_at + seconds(ctx.restore_timeout + ctx.cleanup_timeout):
            return _cleaned(r, now, "gave-up: pod could not be observed", facts)
        return wait(r.issued_at + seconds(ctx.restore_timeout + ctx.cleanup_timeout))
    replaced = r.uid is not None and pod is not None and pod.uid != r.uid
    if pod is None or not _ours(r, pod, machine_id) or replaced or pod.deleting:
        return _cleaned(r, now, "nothing-to-delete", facts)
    event = RestoredPodDeletionRequested(
        at=now, attempt=plan.attempt, cleanup_attempt=1, uid=pod.uid,
        deadline=now + seconds(ctx.cleanup_timeout)).recorded(facts)
    return emit(event, actions=[_delete(r, pod.uid, machine_id, 1)])


def _cleanup(r: Restore, pod: PodFact, now: datetime, machine_id: str) -> Step:
    assert r.cleanup_issued_at is not None
    assert r.cleanup_deadline is not None
    facts = pod_facts(r.plan.key, pod)
    # Gone, not merely terminating: a graceful deletion leaves the object until the node
    # stopped its containers, and a source woken before that would run beside them.
    if pod is None or (isinstance(pod, PodView) and pod.uid != r.cleanup_uid):
        return _cleaned(r, now, "deleted", facts)
    if r.action_error is not None:
        return _cleaned(r, now, f"gave-up: {r.action_error.message}",
                        merge_facts(facts, r.action_error.facts()))
    if now >= r.cleanup_deadline:
        return _cleaned(r, now, "gave-up: deletion not observed in time", facts)
    reissue_at = r.cleanup_issued_at + REISSUE_AFTER
    if isinstance(pod, PodView) and pod.deleting:
        return wait(r.cleanup_deadline)  # the node is stopping its containers
    if isinstance(pod, PodView) and now >= reissue_at:
        attempt = r.cleanup_attempt + 1
        event = RestoredPodDeletionRequested(at=now, attempt=r.plan.attempt,
                                             cleanup_attempt=attempt).recorded(facts)
        return emit(event, actions=[_delete(r, pod.uid, machine_id, attempt)])
    return wait(r.cleanup_deadline, reissue_at)


def _cleaned(r: Restore, now: datetime, how: str, facts: JsonObject) -> Step:
    return emit(RestoreCleanedUp(at=now, attempt=r.plan.attempt, how=how).recorded(facts))


def _create(plan: RestorePlan, ctx: RestoreContext, machine_id: str,
            create_attempt: int) -> Action:
    if plan.handoff_source:
        assert plan.checkpoint_id is not None
        annotations = protocol.restore_handoff_request(
            checkpoint_id=plan.checkpoint_id, source=plan.handoff_source,
            source_uid=plan.handoff_uid, restore_key=restore_key(machine_id, plan.attempt),
            loader=ctx.loader)
    else:
        annotations = protocol.restore_request(
            artifact=plan.artifact, restore_key=restore_key(machine_id, plan.attempt),
            checkpoint_id=plan.checkpoint_id, loader=ctx.loader, unseal=ctx.unseal)
    return create_pod(create_key(machine_id, plan.attempt, create_attempt),
                      namespace=plan.namespace, name=plan.pod_name, template=ctx.template,
                      node=plan.node, annotations=annotations,
                      labels={protocol.MANAGED_BY_LABEL: protocol.MANAGED_BY},
                      images=_images(plan))


def _images(plan: RestorePlan) -> dict[str, str]:
    return {i.container: i.image for i in plan.images}


def _delete(r: Restore, uid: str, machine_id: str, attempt: int) -> Action:
    return delete_pod(cleanup_key(machine_id, r.plan.attempt, attempt),
                      namespace=r.plan.namespace, name=r.plan.pod_name, uid=uid,
                      reason=f"clean up failed restore attempt {r.plan.attempt}")


def evolve_restore(r: Restore | None, event: DomainEvent, *,
                   machine_id: str) -> Restore | None:
    """Fold one event; the first ``RestorePodRequested`` of an attempt starts a new one.
    An event of another attempt leaves this one unchanged."""
    match event:
        case RestorePodRequested(plan=RestorePlan() as plan,
                                 schedule_deadline=datetime() as schedule_deadline,
                                 deadline=datetime() as deadline):
            return Restore(plan=plan, issued_at=event.at, schedule_deadline=schedule_deadline,
                           deadline=deadline, create_attempt=event.create_attempt)
    if r is None:
        return r
    if isinstance(event, RestoreAttemptEvent):
        return r if event.attempt != r.plan.attempt else _evolve_attempt(r, event)
    if isinstance(event, ActionFailed):
        error = ActionError.from_event(event)
        if r.in_flight:
            current = create_key(machine_id, r.plan.attempt, r.create_attempt)
        elif r.status is RestoreStatus.CLEANING:
            current = cleanup_key(machine_id, r.plan.attempt, r.cleanup_attempt)
        else:
            return r
        if error.key == current:
            return replace(r, action_error=error)
    return r


def _evolve_attempt(r: Restore, event: RestoreAttemptEvent) -> Restore:
    match event:
        case RestorePodRequested():
            return replace(r, create_attempt=event.create_attempt, issued_at=event.at)
        case RestorePodObserved():
            return replace(r, status=RestoreStatus.STARTING, uid=event.uid, node=event.node)
        case TargetUnschedulable():
            return replace(r, unschedulable=event.problem)
        case RestoreVerified():
            return replace(r, status=RestoreStatus.VERIFIED, instance_id=event.instance_id,
                           action_error=None)
        case RestoreFailed():
            return replace(r, status=RestoreStatus.FAILED, action_error=None,
                           failure=Failure(event.reason, event.message))
        case RestoredPodDeletionRequested(cleanup_attempt=1, uid=str(uid),
                                          deadline=datetime() as deadline):
            return replace(r, status=RestoreStatus.CLEANING, cleanup_attempt=1,
                           cleanup_uid=uid, cleanup_issued_at=event.at,
                           cleanup_deadline=deadline)
        case RestoredPodDeletionRequested():
            return replace(r, cleanup_attempt=event.cleanup_attempt, cleanup_issued_at=event.at)
        case RestoreCleanedUp():
            return replace(r, status=RestoreStatus.CLEANED, action_error=None)
    return r
