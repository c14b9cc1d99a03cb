"""Given/when/then for every transition of the ``migration`` machine."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import Observation, PodView
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import (
    NS,
    OTHER,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    T0,
    TARGET,
    TEMPLATE,
    Given,
    action_failed,
    at,
    captured_source,
    error,
    migration_artifact,
    migration_body,
    node,
    observe,
    pod,
)

MID = "mig-1"
ART, DIGEST, PINNED, GOOD = migration_artifact(MID)
SRC = f"{NS}/{POD}"


def given(keep_name: bool | None = None, **klass: object) -> Given:
    d = MigrationDecider()
    extra = {} if keep_name is None else {"keep_name": keep_name}
    return Given(d, MID, d.validate_spec(migration_body(klass, **extra)))


def src(**kw: object) -> PodView:
    return captured_source(MID, **kw)


def name(attempt: int) -> str:
    return restore_pod_name(POD, MID, attempt)


def restored(attempt: int = 1, *, node_name: str | None = TARGET, phase: str = "Running",
             uid: str | None = None, **ann: str) -> PodView:
    base = {protocol.RESTORE_KEY: f"{MID}/{attempt}", protocol.RESTORE_ARTIFACT: PINNED}
    base.update(ann)
    return pod(name(attempt), uid=uid or f"uid-r{attempt}", node=node_name, phase=phase,
               annotations=base)


FRESH = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "inst-new"}


def at_restore(attempt: int, p: object, n: str = TARGET, **nodes: object) -> Observation:
    return observe({f"{NS}/{name(attempt)}": p}, nodes={n: node(n), **nodes})  # type: ignore[dict-item]


def checkpointed(keep_name: bool | None = None, **klass: object) -> Given:
    g = given(keep_name, **klass).decided(observe({SRC: pod()}, {ART: None}), T0)
    return g.decided(observe({SRC: src()}, {ART: GOOD}), at(5))


def deleting(keep_name: bool | None = None, **klass: object) -> Given:
    return checkpointed(keep_name, **klass).decided(observe({SRC: src()}, {PINNED: GOOD}), at(6))


def restoring(**klass: object) -> Given:
    return deleting(**klass).decided(observe({SRC: None}, {PINNED: GOOD}), at(7))


def verified(**klass: object) -> Given:
    g = restoring(**klass).decided(at_restore(1, restored(phase="Pending", node_name=None)),
                                   at(8))
    return g.decided(at_restore(1, restored(**FRESH)), at(9), until_idle=False)


def test_migration_captures_the_source_quiesced() -> None:
    """The capture request asks the agent to leave the workload stopped."""
    then = given().when(observe({SRC: pod()}, {ART: None}), T0)
    then.then_events("Started", "CaptureRequested").then_phase("Checkpointing")
    ann = then.action("AnnotatePod").params["annotations"]
    assert isinstance(ann, dict)
    assert ann[protocol.CAPTURE_QUIESCE] == "true"


def test_starting_records_a_kubernetes_event_on_the_source_pod() -> None:
    """kubectl describe pod shows that a migration took the pod, where to, and its id."""
    then = given().when(observe({SRC: pod()}, {ART: None}), T0)
    notice = then.action("EmitEvent")
    assert (notice.params["type"], notice.params["reason"]) == ("Normal", "MigrationStarted")
    assert notice.params["object"] == {"kind": "Pod", "name": POD, "uid": SRC_UID}
    assert str(notice.params["message"]).startswith("moving from node-a to node-b")


def test_verified_artifact_moves_to_deleting_source() -> None:
    """ArtifactVerified (gate 1) is the only way into DeletingSource."""
    assert checkpointed().state.phase == "DeletingSource"


def test_source_is_deleted_by_uid_only_when_this_observation_shows_the_artifact() -> None:
    """Gate 1 and 4: delete with a UID precondition, justified by the pinned tag's facts."""
    then = checkpointed().when(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    then.then_events("SourceDeletionRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    facts = then.event("SourceDeletionRequested").facts
    assert facts["tag_digest"] == DIGEST
    assert facts["pod_uid"] == SRC_UID


@pytest.mark.parametrize("seen", [
    observe({SRC: src()}, {PINNED: error()}),
    observe({SRC: error()}, {PINNED: GOOD}),
])
def test_probe_error_never_deletes_the_source(seen: Observation) -> None:
    """Gate 3: an error on either probe owns the decision: wait, no delete."""
    checkpointed().when(seen, at(6)).then_idle().then_no_action("DeletePod")


def test_probe_errors_until_the_delete_deadline_wake_the_workload_in_place() -> None:
    """Hang guard for DeletingSource: give up deleting and resume the source instead."""
    g = checkpointed()
    then = g.when(observe({SRC: src()}, {PINNED: error()}), at(5 + 300))
    then.then_events("SourceDeletionAborted").then_phase("WakingInPlace")
    g2 = then.and_then()
    g2.when(observe({SRC: src()}), at(306)).then_events("ReleaseRequested") \
        .then_no_action("DeletePod")
    g2.decided(observe({SRC: src()}), at(306)).decided(observe({SRC: pod()}), at(307))
    assert g2.state.phase == "Failed"
    assert g2.state.failure.reason == "Timeout"
    assert g2.state.final_node == SRC_NODE


def test_artifact_gone_before_deletion_aborts_and_resumes_the_source() -> None:
    """An artifact that vanished is never trusted: the source is woken in place."""
    then = checkpointed().when(observe({SRC: src()}, {PINNED: None}), at(6))
    then.then_events("SourceDeletionAborted").then_no_action("DeletePod")
    assert then.event("SourceDeletionAborted").data["reason"] == "ArtifactLost"


def test_source_deleted_starts_the_restore_on_the_target() -> None:
    """Once the source is observed gone, the restore pod is created on the target."""
    then = deleting().when(observe({SRC: None}, {PINNED: GOOD}), at(7))
    then.then_events("SourceDeleted").then_phase("Restoring")
    then = then.and_then().when(observe(), at(7)).then_events("RestorePodRequested")
    params = then.action("CreatePod").params
    assert params["node"] == TARGET
    assert params["name"] == name(1)


def test_source_that_vanished_by_itself_is_restored_from_the_artifact() -> None:
    """A source gone before our delete: its state is in the verified artifact; restore."""
    then = checkpointed().when(observe({SRC: None}, {PINNED: GOOD}), at(6))
    then.then_events("SourceVanished").then_no_action("DeletePod").then_phase("Restoring")
    then.and_then().when(observe(), at(6)).then_events("RestorePodRequested")


def test_failed_delete_wakes_the_source_in_place() -> None:
    """ActionFailed on the delete: never restore over a live source; resume it."""
    g = deleting().event(action_failed(f"{MID}/source/delete/1", "DeletePod"))
    then = g.when(observe({SRC: src()}, {PINNED: GOOD}), at(8))
    then.then_events("SourceDeletionFailed").then_phase("WakingInPlace")


def test_a_delete_that_met_only_transient_errors_is_issued_again_not_given_up() -> None:
    """A 409/500 burst on the source delete (retryable, worker retries spent) is retried
    by the machine after a backoff, not turned into a resume (fault campaign, seed 18)."""
    g = deleting().event(action_failed(f"{MID}/source/delete/1", "DeletePod",
                                       error_class="Conflict", message="409",
                                       retryable=True))
    issued = g.state.source_op.issued_at
    g.when(observe({SRC: src()}, {PINNED: GOOD}), issued + timedelta(seconds=1)).then_idle()
    then = g.when(observe({SRC: src()}, {PINNED: GOOD}), issued + timedelta(seconds=2))
    then.then_events("SourceDeletionRequested").then_phase("DeletingSource")
    assert then.action("DeletePod").key == f"{MID}/source/delete/2"
    # The pod is gone after the second delete: the migration goes on to restore.
    after = then.and_then().when(observe({SRC: None}, {PINNED: GOOD}),
                                 issued + timedelta(seconds=3))
    after.then_events("SourceDeleted")


def test_verified_restore_collects_garbage_then_succeeds() -> None:
    """Gate 2 then 7: the manifest is deleted by digest after RestoreVerified, then success."""
    g = verified()
    assert g.state.phase == "CollectingGarbage"
    then = g.when(observe(tags={PINNED: GOOD}), at(10))
    then.then_events("ArtifactDeletionRequested")
    assert then.action("DeleteManifest").params == {"repository": REPO, "digest": DIGEST}
    g2 = then.and_then()
    g2.when(observe(tags={PINNED: None}), at(11)).then_events("ArtifactDeleted")
    g2.decided(observe(tags={PINNED: None}), at(11))
    assert g2.state.phase == "Succeeded"
    assert g2.state.final_node == TARGET


def test_retention_that_keeps_artifacts_skips_deletion() -> None:
    """delete_after_migration false keeps the artifact; still Succeeded."""
    g = verified(retention={"delete_after_migration": False})
    g.when(observe(tags={PINNED: GOOD}), at(10)).then_events("ArtifactKept") \
        .then_no_action("DeleteManifest")


def test_a_migration_asked_to_keep_its_checkpoint_keeps_it_whatever_the_class_says() -> None:
    """keep_checkpoint: the class deletes after a migration, this one keeps its artifact."""
    d = MigrationDecider()
    g = Given(d, MID, d.validate_spec(migration_body({}, keep_checkpoint=True)))
    g = g.decided(observe({SRC: pod()}, {ART: None}), T0)
    g = g.decided(observe({SRC: src()}, {ART: GOOD}), at(5))
    g = g.decided(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    g = g.decided(observe({SRC: None}, {PINNED: GOOD}), at(7))
    g = g.decided(at_restore(1, restored(phase="Pending", node_name=None)), at(8))
    g = g.decided(at_restore(1, restored(**FRESH)), at(9), until_idle=False)
    then = g.when(observe(tags={PINNED: GOOD}), at(10))
    then.then_events("ArtifactKept").then_no_action("DeleteManifest")
    done = then.and_then().decided(observe(tags={PINNED: GOOD}), at(11))
    assert done.state.phase == "Succeeded"


def test_keep_checkpoint_is_a_boolean_named_in_the_refusal() -> None:
    with pytest.raises(InvalidSpec, match=r"spec.keep_checkpoint 'yes' is not true or false"):
        MigrationDecider().validate_spec(migration_body({}, keep_checkpoint="yes"))


def test_forbidden_gc_is_visible_retried_and_never_a_clean_success() -> None:
    """Gate 7: a 403 sets a condition and a Warning, stays non-terminal, retries later."""
    g = verified().decided(observe(tags={PINNED: GOOD}), at(10))
    g.event(action_failed(f"{MID}/gc/delete/1", "DeleteManifest"))
    then = g.when(observe(tags={PINNED: GOOD}), at(11))
    then.then_events("ArtifactDeletionFailed").then_phase("CollectingGarbage")
    assert then.action("EmitEvent").params["type"] == "Warning"
    assert [c.type for c in then.state.conditions] == ["GarbageCollectionFailed"]
    g2 = then.and_then()
    waiting = g2.when(observe(tags={PINNED: GOOD}), at(12)).then_idle()
    assert waiting.decision.wake_at is not None
    assert waiting.decision.wake_at <= at(21)
    retry = g2.when(observe(tags={PINNED: GOOD}), at(21)).then_events(
        "ArtifactDeletionRequested")
    assert retry.action("DeleteManifest").key == f"{MID}/gc/delete/2"
    g3 = retry.and_then().decided(observe(tags={PINNED: None}), at(22))
    assert g3.state.phase == "Succeeded"
    assert g3.state.conditions == ()


def test_gc_failing_until_its_deadline_ends_in_garbage_collection_failed() -> None:
    """A GC that never succeeds ends in a distinct terminal phase, with a Warning."""
    g = verified().decided(observe(tags={PINNED: GOOD}), at(10))
    g.event(action_failed(f"{MID}/gc/delete/1", "DeleteManifest"))
    g.decided(observe(tags={PINNED: GOOD}), at(11))
    g.decided(observe(tags={PINNED: GOOD}), at(9 + 86400))
    assert g.state.phase == "GarbageCollectionFailed"
    assert g.state.failure.reason == "GarbageCollectionFailed"


def test_gc_probe_error_never_issues_the_delete() -> None:
    """Gate 3 for the manifest delete: a registry error waits."""
    verified().when(observe(tags={PINNED: error()}), at(10)).then_idle() \
        .then_no_action("DeleteManifest")


def test_failed_target_restore_rolls_back_to_the_source_node() -> None:
    """A target that fails is cleaned up and the workload is restored where it was."""
    g = restoring().decided(at_restore(1, restored(phase="Pending", node_name=None)), at(8))
    g.decided(at_restore(1, restored(phase="Pending", node_name=None)), at(7 + 300))
    assert g.state.phase == "Restoring"
    g.decided(at_restore(1, None), at(308))
    assert g.state.phase == "RollingBack"
    assert g.state.target == SRC_NODE
    creates = [e for e in g.history if e.type == "RestorePodRequested" and "plan" in e.data]
    assert creates[-1].data["plan"]["node"] == SRC_NODE  # type: ignore[index]
    rb = restored(2, node_name=SRC_NODE, **FRESH)
    g.decided(observe({f"{NS}/{name(2)}": rb}, nodes={SRC_NODE: node(SRC_NODE)}), at(309))
    g.decided(observe(tags={PINNED: None}), at(310))
    assert g.state.phase == "RolledBack"
    assert g.state.final_node == SRC_NODE


def test_restores_that_keep_failing_end_failed_with_the_artifact_preserved() -> None:
    """Out of attempts: Failed, and the artifact is never deleted."""
    g = restoring(restore_attempts=2)
    g.decided(at_restore(1, restored(phase="Failed")), at(8))
    g.decided(at_restore(1, None), at(9))
    g.decided(at_restore(2, restored(2, node_name=SRC_NODE, phase="Failed"), SRC_NODE), at(10))
    g.decided(at_restore(2, None, SRC_NODE), at(11))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "RestoreFailed"
    assert PINNED in g.state.failure.message
    assert not [e for e in g.history if e.type == "ArtifactDeletionRequested"]


def test_retarget_before_deletion_replans_the_target() -> None:
    """Retarget while checkpointing changes where the restore will go."""
    g = given().decided(observe({SRC: pod()}, {ART: None}), T0).command("Retarget", at(1),
                                                                        node=OTHER)
    assert g.state.target == OTHER
    g.decided(observe({SRC: src()}, {ART: GOOD}), at(5))
    g.decided(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    g.decided(observe({SRC: None}, {PINNED: GOOD}), at(7))
    creates = [e for e in g.history if e.type == "RestorePodRequested" and "plan" in e.data]
    assert creates[-1].data["plan"]["node"] == OTHER  # type: ignore[index]


def test_retarget_back_to_the_current_node_wakes_the_source_in_place() -> None:
    """Retarget to the source node before deletion: release the source, end Cancelled."""
    g = checkpointed().command("Retarget", at(6), node=SRC_NODE)
    assert g.state.phase == "WakingInPlace"
    then = g.when(observe({SRC: src()}), at(6)).then_events("ReleaseRequested")
    then.then_no_action("DeletePod")
    g2 = then.and_then().decided(observe({SRC: pod()}), at(7))
    assert g2.state.phase == "Cancelled"
    assert g2.state.final_node == SRC_NODE


def test_cancel_before_deletion_wakes_the_source_in_place() -> None:
    """Cancel while checkpointing withdraws the request."""
    g = given().decided(observe({SRC: pod()}, {ART: None}), T0).command("Cancel", at(1))
    g.decided(observe({SRC: src()}), at(2)).decided(observe({SRC: pod()}), at(3))
    assert g.state.phase == "Cancelled"


def test_cancel_after_deletion_restores_on_the_original_node() -> None:
    """Gate 6: after the source is gone, cancel means restore where it was."""
    g = restoring().decided(at_restore(1, restored(phase="Pending", node_name=None)), at(8))
    g.command("Cancel", at(9))
    assert g.state.target == SRC_NODE
    then = g.when(at_restore(1, restored(phase="Pending", node_name=None)), at(9))
    assert then.event("RestoreFailed").data["reason"] == "Superseded"
    g.decided(at_restore(1, restored(phase="Pending", node_name=None)), at(9))
    g.decided(at_restore(1, None), at(10))
    creates = [e for e in g.history if e.type == "RestorePodRequested" and "plan" in e.data]
    assert creates[-1].data["plan"]["node"] == SRC_NODE  # type: ignore[index]
    g.decided(observe({f"{NS}/{name(2)}": restored(2, node_name=SRC_NODE, **FRESH)},
                      nodes={SRC_NODE: node(SRC_NODE)}), at(11))
    g.decided(observe(tags={PINNED: None}), at(12))
    assert g.state.phase == "Cancelled"


def test_retarget_during_restore_abandons_the_attempt_and_restores_on_the_new_node() -> None:
    """An unschedulable target can be replaced: the old attempt's pod is cleaned up."""
    g = restoring().decided(at_restore(1, restored(phase="Pending", node_name=None)), at(8))
    g.command("Retarget", at(9), node=OTHER)
    g.decided(at_restore(1, restored(phase="Pending", node_name=None)), at(9))
    g.decided(at_restore(1, None), at(10))
    creates = [e for e in g.history if e.type == "RestorePodRequested" and "plan" in e.data]
    assert creates[-1].data["plan"]["node"] == OTHER  # type: ignore[index]
    assert g.state.failures == 0


def test_commands_after_a_verified_restore_are_rejected() -> None:
    """Once restored, retarget and cancel are refused (start a new migration)."""
    g = verified()
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(10))
    with pytest.raises(CommandRejected):
        g.when_command("Retarget", at(10), node=OTHER)


def test_retarget_to_an_invalid_node_name_is_rejected() -> None:
    """A command with a bad node name is refused with the reason."""
    with pytest.raises(CommandRejected, match="node"):
        given().when_command("Retarget", T0, node="Not A Node")


def test_failed_capture_unsticks_then_fails() -> None:
    """Capture failure: release the source, end Failed; never delete it."""
    g = given().decided(observe({SRC: pod()}, {ART: None}), T0)
    g.decided(observe({SRC: src()}, {ART: None}), at(600))
    assert g.state.phase == "Unsticking"
    g.decided(observe({SRC: pod()}), at(601))
    assert g.state.phase == "Failed"
    assert not [e for e in g.history if e.type == "SourceDeletionRequested"]


def test_wake_in_place_that_finds_the_source_gone_restores_it_instead() -> None:
    """If the source disappeared while being woken, restore from the verified artifact."""
    g = checkpointed().command("Cancel", at(6))
    then = g.when(observe({SRC: None}), at(7)).then_events("SourceVanished")
    then = then.and_then().when(observe(), at(7)).then_events("RestorePodRequested")
    assert then.action("CreatePod").params["node"] == SRC_NODE


def test_terminal_migration_absorbs_commands_and_events() -> None:
    """Terminal phases are absorbing."""
    g = verified().decided(observe(tags={PINNED: None}), at(10))
    assert g.state.terminal
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(11))
    g.when(observe(), at(12)).then_idle()


def test_migration_to_the_current_node_is_rejected() -> None:
    """validate_spec refuses target == source, naming the field."""
    body = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "source_node": SRC_NODE,
            "target_node": SRC_NODE, "template": TEMPLATE}
    with pytest.raises(InvalidSpec, match=r"spec\.target_node"):
        MigrationDecider().validate_spec(body)  # type: ignore[arg-type]


def test_lost_delete_with_a_vanished_artifact_waits_then_wakes_in_place() -> None:
    """A delete lost in a crash is not re-issued once the artifact is gone; at the delete
    deadline the migration gives up and wakes the source in place (regression)."""
    g = deleting()  # the DeletePod action was never performed
    waiting = g.when(observe({SRC: src()}, {PINNED: None}), at(60))
    waiting.then_idle().then_no_action("DeletePod")
    assert waiting.decision.wake_at == at(6 + 300)
    g.decided(observe({SRC: src()}, {PINNED: None}), at(306))
    assert g.state.phase == "WakingInPlace"
    assert g.state.abort.reason == "Timeout"


def test_failed_wake_in_place_fails_loudly() -> None:
    """A release refused for good ends Failed (WakeInPlaceFailed) with a Warning."""
    g = checkpointed().command("Cancel", at(6)).decided(observe({SRC: src()}), at(6))
    g.event(action_failed(f"{MID}/source/release/1", "RemovePodAnnotations"))
    g.decided(observe({SRC: src()}), at(7), until_idle=False)
    then = g.when(observe({SRC: src()}), at(7))
    then.then_events("MigrationFinished").then_phase("Failed")
    assert then.action("EmitEvent").params["type"] == "Warning"
    assert then.state.failure.reason == "WakeInPlaceFailed"


def test_failed_capture_with_a_kill_class_kills_the_source_by_uid() -> None:
    """on_failure: Kill applies to migrations too (after the capture failed)."""
    g = given(on_failure="Kill").decided(observe({SRC: pod()}, {ART: None}), T0)
    g.decided(observe({SRC: src()}, {ART: None}), at(600), until_idle=False)
    then = g.when(observe({SRC: src()}), at(600)).then_events("KillRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    assert "/source/kill/" in then.action("DeletePod").key


def test_a_kept_name_is_taken_only_once_the_source_no_longer_holds_it() -> None:
    """The restored pod gets the source's own name, but not while the terminating
    source still holds it (the create would meet AlreadyExists, or the restore would
    take the source for its pod)."""
    then = deleting(keep_name=True).when(observe({SRC: src(deleting=True)}, {PINNED: GOOD}),
                                         at(7))
    then.then_events("SourceDeleted").then_phase("Restoring")
    waiting = then.and_then().when(observe({SRC: src(deleting=True)}), at(7))
    waiting.then_idle().then_no_action("CreatePod")
    assert waiting.decision.wake_at is not None
    assert waiting.decision.wake_at <= at(8)  # looks again soon
    then = waiting.and_then().when(observe({SRC: None}), at(9))
    then.then_events("RestorePodRequested")
    assert then.action("CreatePod").params["name"] == POD


def test_a_name_held_past_the_delete_timeout_is_given_up_for_a_suffixed_one() -> None:
    """The workload matters more than its name: a source stuck terminating does not
    hold the restore back beyond the delete timeout."""
    g = deleting(keep_name=True, timeouts={"delete": 30}).decided(
        observe({SRC: src(deleting=True)}, {PINNED: GOOD}), at(7))
    then = g.when(observe({SRC: src(deleting=True)}), at(38))
    then.then_events("RestorePodRequested")
    assert then.action("CreatePod").params["name"] == name(1)


def test_without_keep_name_the_restored_pod_is_suffixed_as_before() -> None:
    then = deleting(keep_name=False).when(observe({SRC: None}, {PINNED: GOOD}), at(7))
    then = then.and_then().when(observe(), at(7)).then_events("RestorePodRequested")
    assert then.action("CreatePod").params["name"] == name(1)


def test_keep_name_must_be_a_boolean() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.keep_name"):
        given(keep_name="yes")  # type: ignore[arg-type]
