"""Given/when/then for a migration with ``transfer: stream`` (issue 35): the agents hand the
checkpoint over beside the push, the source stays frozen until the target runs verified
against the registry's copy, and a failure before that wakes the source and removes the
target pod. Every ``when`` also checks determinism, the JSON round trip and replay."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import NodeView, Observation, PodFact, PodView, TagView
from controlplane.machines.config.classes import class_to_json, parse_class
from controlplane.machines.config.modes import Transfer
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import (
    NS,
    OTHER,
    POD,
    SRC_NODE,
    SRC_UID,
    T0,
    TARGET,
    Given,
    action_failed,
    at,
    captured_source,
    digest_of,
    migration_artifact,
    migration_body,
    node,
    observe,
    pod,
)

MID = "mig-s"
ART, DIGEST, PINNED, PLAIN = migration_artifact(MID)
ARCHIVES = {"app": digest_of("app archive")}
OTHER_ARCHIVES = {"app": digest_of("another archive")}
SRC = f"{NS}/{POD}"
RNAME = restore_pod_name(POD, MID, 1)
RKEY = f"{NS}/{RNAME}"
STREAM = {"transfer": "stream"}
MARKED = {**protocol.restored_from_handoff(MID, ARCHIVES), protocol.INSTANCE_ID: "inst-new"}


def manifest_listing(archives: dict[str, str]) -> TagView:
    """The registry's manifest of this checkpoint, listing ``archives``."""
    return TagView(PLAIN.ref, DIGEST, {**PLAIN.annotations, protocol.MANIFEST_ARCHIVE_DIGESTS:
                                       protocol.format_archive_digests(archives)})


GOOD = manifest_listing(ARCHIVES)


def given(klass: dict[str, object] | None = None, **extra: object) -> Given:
    d = MigrationDecider()
    return Given(d, MID, d.validate_spec(migration_body({**STREAM, **(klass or {})}, **extra)))


def src(**ann: str) -> PodView:
    source = captured_source(MID)
    return pod(annotations={**source.annotations, **ann})


def pushed() -> PodView:
    return src(**{protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Pushed",
                  protocol.REPORT_DIGEST: DIGEST})


def target(phase: str = "Running", *, node_name: str | None = TARGET, **ann: str) -> PodView:
    base = {protocol.RESTORE_KEY: f"{MID}/1",
            **protocol.restore_handoff_request(checkpoint_id=MID, source=SRC,
                                               source_uid=SRC_UID, restore_key=f"{MID}/1",
                                               loader=None)}
    return pod(RNAME, uid="uid-r1", node=node_name, phase=phase, annotations={**base, **ann})


def both(source: PodFact, restored: PodFact, tags: dict[str, Any] | None = None,
         runtime: str = "") -> Observation:
    return observe({SRC: source, RKEY: restored}, tags,
                   nodes={TARGET: NodeView(TARGET, ready=True, runtime=runtime)})


def started(klass: dict[str, object] | None = None, **extra: object) -> Given:
    return given(klass, **extra).decided(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}),
                                         T0)


def running_unproven(klass: dict[str, object] | None = None) -> Given:
    """The target runs restored from the stream; the registry has not proven it yet."""
    g = started(klass).decided(both(src(), target("Pending", node_name=None)), at(1))
    return g.decided(both(src(), target(**MARKED)), at(2))


def verified() -> Given:
    """The push proved (gate 1) and the archives equal: the target is verified."""
    return running_unproven().decided(both(pushed(), target(**MARKED), {ART: GOOD}), at(3),
                                      until_idle=False).decided(
        both(pushed(), target(**MARKED)), at(3), until_idle=False)


def types(g: Given) -> list[str]:
    return [e.type for e in g.history]


def wake_to_the_end(g: Given, start: float) -> Given:
    """Drive a wake in place: the target pod goes, the source is released."""
    g.decided(both(src(), target(**MARKED)), at(start))
    g.decided(both(src(), None), at(start + 1))
    return g.decided(both(pod(), None), at(start + 2))


# --- the first decision ---------------------------------------------------------------------

def test_the_first_decision_asks_for_the_handed_off_capture_and_creates_the_target() -> None:
    """One decision: the capture request with capture-handoff to the target, and the
    restore pod on the target with restore-handoff (no restore-artifact), labels parked."""
    then = given().when(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}), T0)
    then.then_events("Started", "CaptureRequested", "RestorePodRequested")
    then.then_phase("Checkpointing")
    ask = then.action("AnnotatePod").params["annotations"]
    assert isinstance(ask, dict)
    assert json.loads(str(ask[protocol.CAPTURE_HANDOFF])) == {"checkpoint": MID,
                                                               "target": TARGET}
    create = then.action("CreatePod").params
    assert create["node"] == TARGET
    assert create["name"] == RNAME
    ann = create["annotations"]
    assert isinstance(ann, dict)
    assert protocol.RESTORE_ARTIFACT not in ann
    assert protocol.restore_handoff(ann) == protocol.RestoreHandoff(MID, NS, POD, SRC_UID)
    template = create["template"]
    assert isinstance(template, dict)
    assert "labels" not in template["metadata"]  # parked: no Service routes to it yet
    assert then.event("RestorePodRequested").data["mode"] == "handoff"


def test_a_kept_name_does_not_apply_the_source_still_holds_it() -> None:
    """A bare pod's restored pod is created beside its source: it keeps its suffix."""
    then = given(keep_name=True).when(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}), T0)
    assert then.action("CreatePod").params["name"] == RNAME
    assert not then.state.spec.keep_name


def test_the_registry_path_stays_the_default() -> None:
    """A class without transfer (or transfer: registry) asks for no handoff."""
    d = MigrationDecider()
    g = Given(d, MID, d.validate_spec(migration_body({"transfer": "registry"})))
    then = g.when(observe({SRC: pod()}), T0)
    then.then_events("Started", "CaptureRequested").then_no_action("CreatePod")
    ask = then.action("AnnotatePod").params["annotations"]
    assert isinstance(ask, dict)
    assert protocol.CAPTURE_HANDOFF not in ask
    assert parse_class({}).transfer is Transfer.REGISTRY
    assert "transfer" not in class_to_json(parse_class({}))
    assert class_to_json(parse_class(STREAM))["transfer"] == "stream"


def test_an_unknown_transfer_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidSpec, match=r"class\.transfer 'pigeon' is not a transfer"):
        parse_class({"transfer": "pigeon"})


# --- verification: gate 1 in the new order --------------------------------------------------

def test_a_marked_target_is_not_verified_before_the_registry_proves_the_artifact() -> None:
    """Running with restored-from-handoff is not enough: no RestoreVerified, no delete."""
    g = running_unproven()
    assert g.state.phase == "Checkpointing"
    assert "RestoreVerified" not in types(g)
    then = g.when(both(src(), target(**MARKED)), at(3)).then_idle()
    assert then.decision.wake_at is not None
    # The push reported but the tag not there yet: still not verified.
    g.decided(both(pushed(), target(**MARKED), {ART: None}), at(4))
    assert "CaptureReported" in types(g)
    assert "RestoreVerified" not in types(g)
    assert g.state.phase == "Checkpointing"


def test_equal_archives_verify_the_restore_after_the_artifact() -> None:
    """ArtifactVerified, then RestoreVerified on equal archive digests; the digest
    recorded is the registry's."""
    g = running_unproven().decided(both(pushed(), target(**MARKED), {ART: GOOD}), at(3),
                                   until_idle=False)
    assert g.state.phase == "Restoring"
    then = g.when(both(pushed(), target(**MARKED)), at(3)).then_events("RestoreVerified")
    assert then.event("RestoreVerified").data["digest"] == DIGEST
    then.then_phase("DeletingSource")


def test_the_happy_path_deletes_the_source_only_after_the_target_is_verified() -> None:
    """The whole history, in order; the source delete is by UID and re-checks gate 1, the
    restored bare pod gets its labels back, then garbage collection as today."""
    g = verified()
    then = g.when(both(pushed(), target(**MARKED), {PINNED: GOOD}), at(4))
    then.then_events("SourceDeletionRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    labels = [a for a in then.actions if a.type == "AnnotatePod"]
    assert labels
    assert labels[0].params["labels"] == {"app": "web"}
    assert labels[0].params["uid"] == "uid-r1"
    g = then.and_then().decided(both(None, target(**MARKED), {PINNED: GOOD}), at(5))
    g.decided(observe(tags={PINNED: GOOD}), at(6)).decided(observe(tags={PINNED: None}), at(7))
    assert g.state.phase == "Succeeded"
    assert g.state.final_node == TARGET
    seen = [t for t in types(g) if t in (
        "Started", "CaptureRequested", "RestorePodRequested", "RestorePodObserved",
        "ArtifactVerified", "RestoreVerified", "SourceDeletionRequested", "SourceDeleted",
        "ArtifactDeletionRequested", "ArtifactDeleted", "MigrationFinished")]
    assert seen == ["Started", "CaptureRequested", "RestorePodRequested",
                    "RestorePodObserved", "ArtifactVerified", "RestoreVerified",
                    "SourceDeletionRequested", "SourceDeleted", "ArtifactDeletionRequested",
                    "ArtifactDeleted", "MigrationFinished"]


def test_keep_checkpoint_and_retention_apply_as_today() -> None:
    g = verified()
    g.decided(both(pushed(), target(**MARKED), {PINNED: GOOD}), at(4))
    g.decided(both(None, target(**MARKED), {PINNED: GOOD}), at(5))
    d = MigrationDecider()
    kept = Given(d, MID, d.validate_spec(migration_body(
        {**STREAM, "retention": {"delete_after_migration": False}})), list(g.history))
    assert kept.state.phase == "CollectingGarbage"
    kept.when(observe(tags={PINNED: GOOD}), at(6)).then_events("ArtifactKept")


def test_unequal_archives_refuse_the_restore_wake_the_source_and_remove_the_target() -> None:
    """The target restored something the registry does not hold: the source is NOT
    deleted; the target pod is removed, the capture request withdrawn (the source thaws),
    and the migration ends Failed saying so."""
    g = running_unproven().decided(
        both(pushed(), target(**MARKED), {ART: manifest_listing(OTHER_ARCHIVES)}), at(3),
        until_idle=False)
    then = g.when(both(pushed(), target(**MARKED)), at(3)).then_events("RestoreFailed")
    assert then.event("RestoreFailed").data["reason"] == "HandoffMismatch"
    g = then.and_then().decided(both(pushed(), target(**MARKED)), at(3), until_idle=False)
    assert g.state.phase == "WakingInPlace"
    assert types(g)[-1] == "HandoffAbandoned"
    removed = g.when(both(pushed(), target(**MARKED)), at(4))
    removed.then_events("RestoredPodDeletionRequested")
    assert removed.action("DeletePod").params["uid"] == "uid-r1"
    wake_to_the_end(g, 4)
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "StreamedRestoreFailed"
    assert "HandoffMismatch" in g.state.failure.message
    assert "workload resumed in place" in g.state.failure.message
    assert g.state.final_node == SRC_NODE
    assert "SourceDeletionRequested" not in types(g)
    assert types(g).index("RestoreCleanedUp") < types(g).index("ReleaseRequested")


def test_a_manifest_without_archive_digests_does_not_verify_a_streamed_restore() -> None:
    g = running_unproven().decided(both(pushed(), target(**MARKED), {ART: PLAIN}), at(3),
                                   until_idle=False)
    then = g.when(both(pushed(), target(**MARKED)), at(3)).then_events("RestoreFailed")
    assert "no archive-digests" in str(then.event("RestoreFailed").data["message"])


# --- failures before verification ----------------------------------------------------------

def test_a_failed_capture_removes_the_target_then_unsticks_the_source() -> None:
    failed = src(**{protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Failed",
                    protocol.REPORT_REASON: "DumpFailed: criu"})
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(failed, target("Pending")), at(2), until_idle=False)
    assert g.state.phase == "Unsticking"
    then = g.when(both(failed, target("Pending")), at(2))
    assert then.event("RestoreFailed").data["reason"] == "Superseded"
    g.decided(both(failed, target("Pending")), at(2))
    g.decided(both(failed, None), at(3)).decided(both(pod(), None), at(4))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "AgentFailed"
    assert "SourceDeletionRequested" not in types(g)
    assert types(g).index("RestoreCleanedUp") < types(g).index("ReleaseRequested")


def test_a_failed_streamed_restore_withdraws_the_capture_and_removes_the_target() -> None:
    broken = target(**{protocol.RESTORE_FAILURE: "HandoffInterrupted: connection reset"})
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(src(), broken), at(2), until_idle=False)
    g.decided(both(src(), broken), at(2), until_idle=False)
    assert g.state.phase == "WakingInPlace"
    wake_to_the_end(g, 3)
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "StreamedRestoreFailed"
    assert "HandoffInterrupted" in g.state.failure.message
    assert "SourceDeletionRequested" not in types(g)
    assert "ReleaseRequested" in types(g)


def test_a_streamed_restore_past_its_deadline_wakes_the_source() -> None:
    """The restore deadline (here before the capture's) fails the attempt: no proof."""
    g = running_unproven({"timeouts": {"schedule": 60, "restore": 120}})
    deadline = g.state.restore.deadline
    g.decided(both(src(), target(**MARKED)), deadline, until_idle=False)
    assert g.state.restore.failure.reason == "Timeout"
    g.decided(both(src(), target(**MARKED)), deadline, until_idle=False)
    assert g.state.phase == "WakingInPlace"
    g.decided(both(src(), target(**MARKED)), deadline)
    g.decided(both(src(), None), deadline).decided(both(pod(), None), deadline)
    assert g.state.phase == "Failed"
    assert "SourceDeletionRequested" not in types(g)


def test_cancel_before_verification_removes_the_target_and_wakes_the_source() -> None:
    g = running_unproven().command("Cancel", at(3))
    assert g.state.phase == "WakingInPlace"
    then = g.when(both(src(), target(**MARKED)), at(3))
    assert then.event("RestoreFailed").data["reason"] == "Superseded"
    wake_to_the_end(g, 3)
    assert g.state.phase == "Cancelled"
    assert "SourceDeletionRequested" not in types(g)


def test_retarget_elsewhere_is_refused_while_streaming_back_home_wakes_in_place() -> None:
    g = running_unproven()
    with pytest.raises(CommandRejected, match="streams its checkpoint"):
        g.when_command("Retarget", at(3), node=OTHER)
    g.command("Retarget", at(3), node=SRC_NODE)
    assert g.state.phase == "WakingInPlace"


def test_commands_after_the_target_is_verified_are_refused() -> None:
    """Verified: the source is only deleted now; a cancel would leave two copies."""
    g = verified()
    assert g.state.phase == "DeletingSource"
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(4))


def test_a_source_that_cannot_be_deleted_after_verification_is_never_woken() -> None:
    """The target runs: the frozen source is left as it is and the migration says so."""
    g = verified().decided(both(pushed(), target(**MARKED), {PINNED: GOOD}), at(4))
    g.event(action_failed(f"{MID}/source/delete/1", "DeletePod"))
    g.decided(both(pushed(), target(**MARKED), {PINNED: GOOD}), at(5))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "SourceNotDeleted"
    assert g.state.final_node == TARGET
    assert "ReleaseRequested" not in types(g)


def test_an_artifact_lost_before_the_source_delete_ends_failed_not_woken() -> None:
    g = verified().decided(both(pushed(), target(**MARKED), {PINNED: None}), at(4))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "SourceNotDeleted"
    assert "ReleaseRequested" not in types(g)


# --- where the stream does not apply --------------------------------------------------------

def test_a_statefulset_successor_keeps_the_registry_path() -> None:
    """The successor needs the source's name: the source goes first, as today."""
    then = given(successor="gated").when(observe({SRC: pod()}), T0)
    then.then_events("Started", "CaptureRequested").then_no_action("CreatePod")
    ask = then.action("AnnotatePod").params["annotations"]
    assert isinstance(ask, dict)
    assert protocol.CAPTURE_HANDOFF not in ask
    assert not then.state.streams


def test_a_replicaset_pod_streams_and_is_adopted_after_verification() -> None:
    g = started(successor="adopt")
    assert "RestorePodRequested" in types(g)
    g.decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(src(), target(**MARKED)), at(2))
    g.decided(both(pushed(), target(**MARKED), {ART: GOOD}), at(3), until_idle=False)
    g.decided(both(pushed(), target(**MARKED)), at(3), until_idle=False)
    assert g.state.phase == "Adopting"


def test_a_cri_o_target_declines_the_stream_and_takes_the_registry() -> None:
    """CRI-O restores checkpoint images itself: recorded, then the registry path."""
    then = given().when(observe({SRC: pod()}, nodes={
        TARGET: NodeView(TARGET, ready=True, runtime="cri-o://1.36.3")}), T0)
    then.then_events("Started", "StreamDeclined").then_no_action("CreatePod")
    assert "cri-o" in str(then.event("StreamDeclined").data["reason"])
    nxt = then.and_then().when(observe({SRC: pod()}, nodes={
        TARGET: NodeView(TARGET, ready=True, runtime="cri-o://1.36.3")}), at(1))
    nxt.then_events("CaptureRequested").then_no_action("CreatePod")
    ask = nxt.action("AnnotatePod").params["annotations"]
    assert isinstance(ask, dict)
    assert protocol.CAPTURE_HANDOFF not in ask
