"""Given/when/then for every transition of the ``restore`` machine."""

from __future__ import annotations

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import Observation, PodView
from controlplane.machines.contract import protocol
from controlplane.machines.restore.machine import RestoreDecider
from tests.machines.machines_gwt import (
    NS,
    REPO,
    SRC_UID,
    T0,
    TARGET,
    TEMPLATE,
    Given,
    action_failed,
    at,
    digest_of,
    error,
    manifest,
    node,
    observe,
    pod,
)

MID = "restore-1"
DIGEST = digest_of("ckpt-9")
PINNED = f"{REPO}@{DIGEST}"
NAME = "web-restored"
KEY = f"{NS}/{NAME}"
GOOD = manifest(PINNED, DIGEST, checkpoint_id="ckpt-9")


def given(**extra: object) -> Given:
    body: dict[str, object] = {"artifact": PINNED, "namespace": NS, "name": NAME,
                               "node": TARGET, "template": TEMPLATE,
                               "checkpoint_id": "ckpt-9", "source_uid": SRC_UID,
                               "source_instance": "inst-src"}
    body.update(extra)
    d = RestoreDecider()
    return Given(d, MID, d.validate_spec(body))  # type: ignore[arg-type]


def ours(*, uid: str = "uid-new", node_name: str | None = TARGET, phase: str = "Running",
         **ann: str) -> PodView:
    base = {protocol.RESTORE_KEY: f"{MID}/1", protocol.RESTORE_ARTIFACT: PINNED}
    base.update(ann)
    return pod(NAME, uid=uid, node=node_name, phase=phase, annotations=base)


def obs(p: object = None, target: object = None) -> Observation:
    return observe({KEY: p}, nodes={TARGET: target if target is not None else node(TARGET)})  # type: ignore[dict-item]


def restoring() -> Given:
    return given().decided(observe(tags={PINNED: GOOD}), T0)


REPORTED = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "inst-new"}


def test_resolved_artifact_creates_the_pod_with_required_affinity_and_restore_annotation() -> None:
    """The pod targets the node by required affinity (the driver never sets nodeName)."""
    then = given().when(observe(tags={PINNED: GOOD}), T0)
    then.then_events("Started", "ArtifactResolved", "RestorePodRequested")
    params = then.action("CreatePod").params
    assert params["node"] == TARGET
    assert params["name"] == NAME
    assert params["template"] == TEMPLATE
    ann = params["annotations"]
    assert isinstance(ann, dict)
    assert ann[protocol.RESTORE_ARTIFACT] == PINNED
    assert ann[protocol.RESTORE_KEY] == f"{MID}/1"
    then.then_phase("Restoring")


def test_missing_artifact_fails_without_creating_a_pod() -> None:
    """An artifact that is not in the registry cannot be restored."""
    then = given().when(observe(tags={PINNED: None}), T0)
    then.then_events("Started", "RestoreFinished").then_no_action("CreatePod")
    assert then.event("RestoreFinished").data["reason"] == "ArtifactMissing"


def test_registry_error_waits_then_fails_at_the_deadline() -> None:
    """A probe error is not absence: wait; fail (without a pod) at the deadline."""
    g = given().decided(observe(tags={PINNED: error()}), T0)
    g.when(observe(tags={PINNED: error()}), at(10)).then_idle()
    end = g.when(observe(tags={PINNED: error()}), at(300))
    assert end.event("RestoreFinished").data["reason"] == "RegistryUnavailable"


def test_foreign_manifest_is_refused() -> None:
    """The manifest must name the expected checkpoint."""
    foreign = manifest(PINNED, DIGEST, checkpoint_id="ckpt-other")
    then = given().when(observe(tags={PINNED: foreign}), T0)
    assert then.event("RestoreFinished").data["reason"] == "ArtifactProvenance"


def test_our_pod_is_adopted_by_its_restore_key_and_uid() -> None:
    """The created pod is recognised by its restore-key and then tracked by UID."""
    then = restoring().when(obs(ours(node_name=None, phase="Pending")), at(2))
    then.then_events("RestorePodObserved")
    assert then.event("RestorePodObserved").data["uid"] == "uid-new"


def test_running_pod_with_fresh_identity_from_the_digest_succeeds() -> None:
    """Gate 2's proof: Running, restored from exactly this digest, a fresh instance id."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    then = g.when(obs(ours(**REPORTED)), at(5))
    then.then_events("RestoreVerified")
    g2 = then.and_then().decided(obs(ours(**REPORTED)), at(5))
    assert g2.state.phase == "Succeeded"
    assert g2.state.instance_id == "inst-new"


def test_reused_instance_identity_is_not_proof() -> None:
    """An instance id equal to the source's does not prove a fresh restore: keep waiting."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    stale = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "inst-src"}
    g.when(obs(ours(**stale)), at(5)).then_idle()


def test_restore_from_another_digest_fails_and_cleans_up_its_pod() -> None:
    """A pod restored from the wrong artifact fails; our pod is deleted by UID."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    wrong = {protocol.RESTORED_FROM_DIGEST: digest_of("x"), protocol.INSTANCE_ID: "i"}
    then = g.when(obs(ours(**wrong)), at(5))
    assert then.event("RestoreFailed").data["reason"] == "WrongArtifact"
    then.then_phase("CleaningUp")
    cleanup = then.and_then().when(obs(ours(**wrong)), at(6))
    cleanup.then_events("RestoredPodDeletionRequested")
    assert cleanup.action("DeletePod").params["uid"] == "uid-new"
    done = cleanup.and_then().when(obs(None), at(7)).then_events("RestoreCleanedUp")
    done.and_then().when(obs(None), at(8)).then_phase("Failed")


def test_cordoned_target_is_reported_once_and_fails_at_the_schedule_deadline() -> None:
    """An unschedulable target is visible (event + Warning), then fails on its deadline."""
    pending = ours(phase="Pending", node_name=None)
    g = restoring().decided(obs(pending), at(2))
    then = g.when(obs(pending, node(TARGET, cordoned=True)), at(3))
    then.then_events("TargetUnschedulable")
    assert then.action("EmitEvent").params["type"] == "Warning"
    g2 = then.and_then()
    g2.when(obs(pending, node(TARGET, cordoned=True)), at(4)).then_idle()
    end = g2.when(obs(pending, node(TARGET, cordoned=True)), at(300))
    assert end.event("RestoreFailed").data["reason"] == "Unschedulable"


def test_foreign_pod_under_our_name_is_never_adopted_or_deleted() -> None:
    """Gate 4: a same-named pod without our restore key fails the restore and is left alone."""
    foreign = pod(NAME, uid="stranger", node=TARGET)
    g = restoring()
    then = g.when(obs(foreign), at(2))
    assert then.event("RestoreFailed").data["reason"] == "NameConflict"
    after = then.and_then().when(obs(foreign), at(3))
    after.then_events("RestoreCleanedUp").then_no_action("DeletePod")


def test_pod_lost_in_a_crash_is_created_again_under_the_same_name() -> None:
    """A create not visible 30 s later is re-issued (same name, new key)."""
    then = restoring().when(obs(None), at(30))
    then.then_events("RestorePodRequested")
    act = then.action("CreatePod")
    assert act.params["name"] == NAME
    assert act.key == f"{MID}/restore/1/create/2"


def test_refused_create_fails_the_restore() -> None:
    """ActionFailed on CreatePod fails the attempt (CreateRejected)."""
    g = restoring().event(action_failed(f"{MID}/restore/1/create/1", "CreatePod"))
    assert g.when(obs(None), at(2)).event("RestoreFailed").data["reason"] == "CreateRejected"


@pytest.mark.parametrize(("seen", "reason"), [
    (None, "RestoredPodVanished"),
    (ours(uid="uid-other"), "RestoredPodReplaced"),
    (ours(**{protocol.RESTORE_FAILURE: "criu restore failed"}), "AgentRestoreFailed"),
    (ours(phase="Failed"), "RestoredPodExited"),
    (ours(node_name="node-z"), "WrongNode"),
])
def test_restored_pod_trouble_fails_the_attempt(seen: PodView | None, reason: str) -> None:
    """Vanished, replaced, failed or misplaced pods fail the attempt with a typed reason."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    assert g.when(obs(seen), at(5)).event("RestoreFailed").data["reason"] == reason


def test_restore_deadline_fails_as_timeout() -> None:
    """Hang guard: a restore that never proves itself fails at the restore deadline."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    then = g.when(obs(ours()), at(900))
    assert then.event("RestoreFailed").data["reason"] == "Timeout"


def test_cancel_abandons_the_restore_and_removes_its_pod() -> None:
    """Cancel mid-restore deletes our pod and ends Cancelled."""
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    g.command("Cancel", at(3))
    then = g.when(obs(ours(phase="Pending", node_name=None)), at(3))
    assert then.event("RestoreFailed").data["reason"] == "Superseded"
    g.decided(obs(ours(phase="Pending", node_name=None)), at(3)).decided(obs(None), at(4))
    assert g.state.phase == "Cancelled"
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(5))


def test_cancel_before_resolution_ends_at_once() -> None:
    """Cancel before any pod exists ends Cancelled without actions."""
    g = given().command("Cancel", T0)
    then = g.when(observe(tags={PINNED: GOOD}), T0).then_no_action("CreatePod")
    then.then_phase("Cancelled")


@pytest.mark.parametrize(("bad", "field"), [
    ({"artifact": f"{REPO}:tag"}, "spec.artifact"),
    ({"node": "Bad_Node"}, "spec.node"),
    ({"template": {"spec": {"containers": [], "nodeName": "x"}}}, "spec.template"),
    ({"template": {"spec": {"containers": [{"name": "a"}], "nodeName": "x"}}},
     r"spec\.template\.spec\.nodeName"),
    ({"checkpoint_id": ""}, "spec.checkpoint_id"),
])
def test_bad_restore_specs_are_rejected_naming_the_field(bad: dict[str, object],
                                                         field: str) -> None:
    """A tag-only artifact, a nodeName bind or a bad node name are refused."""
    body: dict[str, object] = {"artifact": PINNED, "namespace": NS, "name": NAME,
                               "node": TARGET, "template": TEMPLATE}
    body.update(bad)
    with pytest.raises(InvalidSpec, match=field):
        RestoreDecider().validate_spec(body)  # type: ignore[arg-type]


def test_wake_keys_name_the_pod_until_its_uid_is_known() -> None:
    """A created pod wakes the machine by namespace/name until observed, then by UID too."""
    g = restoring()
    assert g.state.wake_keys == frozenset({KEY})
    g.decided(obs(ours(phase="Pending", node_name=None)), at(2))
    assert g.state.wake_keys == frozenset({KEY, "uid-new"})


def test_finishing_records_a_kubernetes_event_on_the_restored_pod() -> None:
    g = restoring().decided(obs(ours(phase="Pending", node_name=None)), at(2))
    g2 = g.when(obs(ours(**REPORTED)), at(5)).and_then()
    then = g2.when(obs(ours(**REPORTED)), at(5)).then_phase("Succeeded")
    notice = then.action("EmitEvent")
    assert (notice.params["type"], notice.params["reason"]) == ("Normal", "RestoreSucceeded")
    assert notice.params["object"] == {"kind": "Pod", "name": NAME, "uid": None}
    assert MID in str(notice.params["message"])
