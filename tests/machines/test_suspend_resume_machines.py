"""Given/when/then for every transition of the ``suspend`` and ``resume`` machines."""

from __future__ import annotations

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import PodView
from controlplane.machines.contract import protocol
from controlplane.machines.resume.machine import ResumeDecider
from controlplane.machines.stages.restore import restore_pod_name
from controlplane.machines.suspend.machine import SuspendDecider
from tests.machines.machines_gwt import (
    NS,
    POD,
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

SID = "susp-1"
ART = f"{REPO}:{NS}.{POD}.{SID}"
DIGEST = digest_of(SID)
PINNED = f"{REPO}@{DIGEST}"
SRC = f"{NS}/{POD}"
GOOD = manifest(PINNED, DIGEST, checkpoint_id=SID)


def suspend() -> Given:
    d = SuspendDecider()
    body = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "template": TEMPLATE,
            "class": {"repository": REPO}}
    return Given(d, SID, d.validate_spec(body))  # type: ignore[arg-type]


def src() -> PodView:
    return pod(annotations={protocol.CAPTURE_CHECKPOINT_ID: SID})


def captured() -> Given:
    g = suspend().decided(observe({SRC: pod()}, {ART: None}), T0)
    return g.decided(observe({SRC: src()}, {ART: GOOD}), at(5))


def test_suspend_checkpoints_quiesced_then_deletes_the_pod_and_keeps_the_spec() -> None:
    """suspend = checkpoint(quiesce) + delete; the terminal state names the artifact."""
    g = captured()
    assert g.state.phase == "DeletingSource"
    then = g.when(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    then.then_events("SourceDeletionRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    g2 = then.and_then().decided(observe({SRC: pod(deleting=True)}, {PINNED: GOOD}), at(7))
    assert g2.state.phase == "Suspended"
    assert g2.state.artifact == PINNED
    assert g2.state.template == TEMPLATE


def test_suspend_never_deletes_on_a_registry_error() -> None:
    """Gate 3: the delete waits for a clean observation of the artifact."""
    captured().when(observe({SRC: src()}, {PINNED: error()}), at(6)).then_idle() \
        .then_no_action("DeletePod")


def test_suspend_of_a_vanished_source_is_still_suspended() -> None:
    """The pod went away after a verified capture: the workload is suspended in the artifact."""
    g = captured().decided(observe({SRC: None}, {PINNED: GOOD}), at(6))
    assert g.state.phase == "Suspended"


def test_failed_suspend_capture_resumes_the_workload() -> None:
    """A capture that fails releases the source and ends Failed."""
    g = suspend().decided(observe({SRC: pod()}, {ART: None}), T0)
    g.decided(observe({SRC: src()}, {ART: None}), at(600))
    assert g.state.phase == "Unsticking"
    g.decided(observe({SRC: pod()}), at(601))
    assert g.state.phase == "Failed"


def test_cancelled_suspend_wakes_the_workload_in_place() -> None:
    """Cancel before the delete withdraws the request; Cancelled."""
    g = captured().command("Cancel", at(6))
    g.when(observe({SRC: src()}), at(6)).then_events("ReleaseRequested")
    g.decided(observe({SRC: src()}), at(6)).decided(observe({SRC: pod()}), at(7))
    assert g.state.phase == "Cancelled"


def test_cancel_after_the_delete_is_rejected() -> None:
    """Once the pod is being deleted, the way back is a resume."""
    g = captured().decided(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    with pytest.raises(CommandRejected, match="resume"):
        g.when_command("Cancel", at(7))


def test_refused_delete_resumes_the_workload_and_fails() -> None:
    """ActionFailed on the delete: wake in place, end Failed with the reason."""
    g = captured().decided(observe({SRC: src()}, {PINNED: GOOD}), at(6))
    g.event(action_failed(f"{SID}/source/delete/1", "DeletePod"))
    g.decided(observe({SRC: src()}, {PINNED: GOOD}), at(7))
    assert g.state.phase == "WakingInPlace"
    g.decided(observe({SRC: pod()}), at(8))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "ActionFailed"


def test_lost_artifact_before_the_delete_aborts_the_suspend() -> None:
    """An artifact gone before the delete: wake in place, Failed (ArtifactLost)."""
    g = captured().decided(observe({SRC: src()}, {PINNED: None}), at(6))
    g.decided(observe({SRC: pod()}), at(7))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "ArtifactLost"


# --- resume -----------------------------------------------------------------------

RID = "resume-1"
OLD = f"{REPO}@{digest_of('old')}"
KEY = f"{NS}/{POD}"


def resume(candidates: list[dict[str, object]], **klass: object) -> Given:
    d = ResumeDecider()
    body = {"namespace": NS, "name": POD, "node": TARGET, "template": TEMPLATE,
            "candidates": candidates, "class": {"repository": REPO, **klass}}
    return Given(d, RID, d.validate_spec(body))  # type: ignore[arg-type]


NEWEST = {"artifact": PINNED, "checkpoint_id": SID, "source_uid": SRC_UID}
OLDER = {"artifact": OLD, "checkpoint_id": "susp-0"}
OLD_GOOD = manifest(OLD, digest_of("old"), checkpoint_id="susp-0")


def created(attempt: int = 1, *, phase: str = "Running", artifact: str | None = PINNED,
            **ann: str) -> PodView:
    base = {protocol.RESTORE_KEY: f"{RID}/{attempt}"}
    if artifact:
        base[protocol.RESTORE_ARTIFACT] = artifact
    base.update(ann)
    name = POD if attempt == 1 else restore_pod_name(POD, RID, attempt)
    return pod(name, uid=f"uid-{attempt}", node=TARGET, phase=phase, annotations=base)


def test_resume_without_checkpoints_cold_boots_and_records_why() -> None:
    """No checkpoint recorded: cold boot from the saved spec, with the reason."""
    then = resume([]).when(observe(), T0)
    then.then_events("Started", "ColdBootChosen", "RestorePodRequested")
    assert "no checkpoint" in str(then.event("ColdBootChosen").data["reason"])
    ann = then.action("CreatePod").params["annotations"]
    assert isinstance(ann, dict)
    assert protocol.RESTORE_ARTIFACT not in ann
    g = then.and_then().decided(observe({KEY: created(artifact=None, phase="Pending")},
                                        nodes={TARGET: node(TARGET)}), at(1))
    g.decided(observe({KEY: created(artifact=None)}, nodes={TARGET: node(TARGET)}), at(2))
    assert g.state.phase == "Resumed"


def test_resume_restores_the_newest_present_checkpoint() -> None:
    """The first candidate present with matching provenance is restored."""
    then = resume([NEWEST, OLDER]).when(observe(tags={PINNED: GOOD, OLD: OLD_GOOD}), T0)
    then.then_events("Started", "CheckpointSelected", "RestorePodRequested")
    ann = then.action("CreatePod").params["annotations"]
    assert isinstance(ann, dict)
    assert ann[protocol.RESTORE_ARTIFACT] == PINNED
    fresh = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "i-1"}
    g = then.and_then().decided(observe({KEY: created(phase="Pending")},
                                        nodes={TARGET: node(TARGET)}), at(1))
    g.decided(observe({KEY: created(**fresh)}, nodes={TARGET: node(TARGET)}), at(2))
    assert g.state.phase == "Resumed"


def test_absent_newest_checkpoint_is_skipped_for_the_next() -> None:
    """An absent candidate is skipped with its reason; the next one is used."""
    g = resume([NEWEST, OLDER])
    then = g.when(observe(tags={PINNED: None, OLD: OLD_GOOD}), T0)
    then.then_events("Started", "CandidateSkipped")
    nxt = then.and_then().when(observe(tags={OLD: OLD_GOOD}), T0)
    nxt.then_events("CheckpointSelected", "RestorePodRequested")
    assert nxt.event("CheckpointSelected").data["index"] == 1


def test_registry_error_never_leads_to_a_cold_boot() -> None:
    """Gate 3: an unreadable checkpoint is waited on, then fails; it is never skipped."""
    g = resume([NEWEST])
    g.when(observe(tags={PINNED: error()}), T0).then_events("Started") \
        .then_no_action("CreatePod")
    g.decided(observe(tags={PINNED: error()}), T0)
    end = g.when(observe(tags={PINNED: error()}), at(300))
    end.then_events("ResumeFinished").then_no_action("CreatePod")
    assert end.event("ResumeFinished").data["reason"] == "RegistryUnavailable"


def test_all_checkpoints_absent_cold_boots_with_the_reason() -> None:
    """Only when every candidate is known absent (or foreign) does resume cold boot."""
    foreign = manifest(PINNED, DIGEST, checkpoint_id="someone-else")
    g = resume([NEWEST, OLDER]).decided(observe(tags={PINNED: foreign, OLD: None}), T0)
    chosen = [e for e in g.history if e.type == "ColdBootChosen"]
    assert chosen
    assert "2 recorded checkpoint" in str(chosen[0].data["reason"])
    assert g.state.phase == "ColdBooting"


def test_failed_restore_is_retried_and_never_becomes_a_cold_boot() -> None:
    """A restore that fails is retried under a new name; out of attempts it fails."""
    g = resume([NEWEST], restore_attempts=2).decided(observe(tags={PINNED: GOOD}), T0)
    nodes = {TARGET: node(TARGET)}
    g.decided(observe({KEY: created(phase="Failed")}, nodes=nodes), at(1))
    g.decided(observe({KEY: None}, nodes=nodes), at(2))
    second = restore_pod_name(POD, RID, 2)
    assert g.state.restore.plan.pod_name == second
    assert g.state.restore.plan.artifact == PINNED
    g.decided(observe({f"{NS}/{second}": created(2, phase="Failed")}, nodes=nodes), at(3))
    g.decided(observe({f"{NS}/{second}": None}, nodes=nodes), at(4))
    assert g.state.phase == "Failed"
    assert not [e for e in g.history if e.type == "ColdBootChosen"]


def test_cancelled_resume_before_selection_ends_cancelled() -> None:
    """Cancel while selecting ends at once."""
    g = resume([NEWEST]).command("Cancel", T0)
    g.when(observe(tags={PINNED: GOOD}), T0).then_phase("Cancelled").then_no_action("CreatePod")


def test_bad_resume_candidates_are_rejected_naming_the_field() -> None:
    """A candidate must pin its artifact by digest."""
    d = ResumeDecider()
    body = {"namespace": NS, "name": POD, "template": TEMPLATE,
            "candidates": [{"artifact": f"{REPO}:latest"}]}
    with pytest.raises(InvalidSpec, match=r"spec\.candidates\[0\]\.artifact"):
        d.validate_spec(body)  # type: ignore[arg-type]
