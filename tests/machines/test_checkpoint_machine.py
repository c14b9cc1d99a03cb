"""Given/when/then for every transition of the ``checkpoint`` machine."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from controlplane.engine.decider import CommandRejected, Event, InvalidSpec
from controlplane.machines.checkpoint.machine import CheckpointDecider
from controlplane.machines.contract import protocol
from tests.machines.machines_gwt import (
    NS,
    POD,
    REPO,
    SRC_UID,
    T0,
    Given,
    action_failed,
    at,
    digest_of,
    error,
    manifest,
    observe,
    pod,
)

CID = "ckpt-1"
ART = f"{REPO}:{NS}.{POD}.{CID}"
DIGEST = digest_of("ckpt-1")


def spec(**extra: object) -> dict[str, object]:
    body: dict[str, object] = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID},
                               "class": {"repository": REPO}}
    body.update(extra)
    return body


def given(**extra: object) -> Given:
    d = CheckpointDecider()
    return Given(d, CID, d.validate_spec(spec(**extra)))  # type: ignore[arg-type]


def requested_pod(**ann: str) -> object:
    base = {protocol.CAPTURE_CHECKPOINT_ID: CID, protocol.CAPTURE_ARTIFACT: ART}
    base.update(ann)
    return pod(annotations=base)


def obs(p: object = None, tag: object = None) -> object:
    return observe({f"{NS}/{POD}": p if p is not None else requested_pod()},  # type: ignore[dict-item]
                   {ART: tag})  # type: ignore[dict-item]


def requested(**extra: object) -> Given:
    return given(**extra).decided(observe({f"{NS}/{POD}": pod()}), T0)


GOOD = manifest(ART, DIGEST, checkpoint_id=CID)


def test_capture_is_requested_on_the_running_source_with_a_uid_precondition() -> None:
    """A new checkpoint annotates the source pod, and only the pod with the submitted UID."""
    then = given().when(observe({f"{NS}/{POD}": pod()}), T0)
    then.then_events("Started", "CaptureRequested").then_phase("Requested")
    act = then.action("AnnotatePod")
    assert act.params["uid"] == SRC_UID
    ann = act.params["annotations"]
    assert isinstance(ann, dict)
    assert ann[protocol.CAPTURE_CHECKPOINT_ID] == CID
    assert ann[protocol.CAPTURE_ARTIFACT] == ART
    assert ann[protocol.CAPTURE_QUIESCE] == "false"
    assert then.event("CaptureRequested").facts["pod_uid"] == SRC_UID


def test_probe_error_before_the_request_waits_until_the_capture_deadline() -> None:
    """An unreadable source is not a missing source: wait (gate 3), bounded by the deadline."""
    then = given().when(observe({f"{NS}/{POD}": error()}), T0)
    then.then_events("Started").then_no_action("AnnotatePod")
    then.and_then().when(observe({f"{NS}/{POD}": error()}), at(30)).then_idle(wake_at=at(600))
    then.and_then().when(observe({f"{NS}/{POD}": error()}), at(600)) \
        .then_events("CaptureFailed").then_phase("Unsticking")


def test_missing_source_fails_the_capture_without_touching_anything() -> None:
    """A source that is gone fails the capture as SourceGone and ends Failed, no unstick."""
    then = given().when(observe({f"{NS}/{POD}": None}), T0)
    then.then_events("Started", "CaptureFailed").then_no_action("AnnotatePod", "DeletePod")
    assert then.event("CaptureFailed").data["reason"] == "SourceGone"
    then.and_then().when(observe({f"{NS}/{POD}": None}), at(1)) \
        .then_events("CheckpointFinished").then_phase("Failed")


def test_pod_recreated_under_the_same_name_is_not_the_source() -> None:
    """Gate 4: a pod with the same name and another UID is never captured or touched."""
    then = given().when(observe({f"{NS}/{POD}": pod(uid="other")}), T0)
    then.then_events("Started", "CaptureFailed").then_no_action("AnnotatePod", "DeletePod")
    then.and_then().when(observe({f"{NS}/{POD}": pod(uid="other")}), at(1)) \
        .then_no_action("RemovePodAnnotations", "DeletePod").then_phase("Failed")


def test_agent_push_report_moves_to_captured_but_proves_nothing() -> None:
    """A Pushed report is a hint: the phase is Captured, not Verified."""
    reported = requested_pod(**{protocol.REPORT_CHECKPOINT_ID: CID,
                                protocol.REPORT_STATE: "Pushed",
                                protocol.REPORT_DIGEST: DIGEST})
    requested().when(obs(reported), at(5)).then_events("CaptureReported").then_phase("Captured")


def test_tag_with_matching_provenance_verifies_the_artifact() -> None:
    """Gate 1: digest plus checkpoint id plus source UID in the manifest verify it."""
    then = requested().when(obs(tag=GOOD), at(5))
    then.then_events("ArtifactVerified").then_phase("Verified")
    event = then.event("ArtifactVerified")
    assert event.data["pinned"] == f"{REPO}@{DIGEST}"
    assert event.facts["tag_digest"] == DIGEST


@pytest.mark.parametrize(("cid", "uid"), [("ckpt-0", SRC_UID), (CID, "uid-old")])
def test_stale_tag_is_recorded_once_and_never_trusted(cid: str, uid: str) -> None:
    """A tag left by another checkpoint or pod is StaleArtifactSeen once, then waited past."""
    stale = manifest(ART, digest_of("old"), checkpoint_id=cid, uid=uid)
    then = requested().when(obs(tag=stale), at(5))
    then.then_events("StaleArtifactSeen").then_phase("Requested")
    then.and_then().when(obs(tag=stale), at(6)).then_idle()


def test_registry_probe_error_polls_and_never_fails_early() -> None:
    """A registry error while capturing is waited out, polling with backoff."""
    then = requested().when(obs(tag=error()), at(5))
    then.then_idle()
    assert then.decision.wake_at is not None
    assert then.decision.wake_at <= at(600)


def test_agent_failure_unsticks_the_source_by_withdrawing_the_request() -> None:
    """Gate 5: a failed capture withdraws the request (agent resumes the workload)."""
    failed = requested_pod(**{protocol.REPORT_CHECKPOINT_ID: CID,
                              protocol.REPORT_STATE: "Failed",
                              protocol.REPORT_REASON: "criu: dump failed"})
    then = requested().when(obs(failed), at(5))
    then.then_events("CaptureFailed").then_phase("Unsticking")
    assert then.event("CaptureFailed").data["reason"] == "AgentFailed"
    assert then.action("EmitEvent").params["type"] == "Warning"
    g = then.and_then()
    release = g.when(obs(failed), at(6))
    release.then_events("ReleaseRequested").then_actions("RemovePodAnnotations")
    assert release.action("RemovePodAnnotations").params["uid"] == SRC_UID
    released = release.and_then().when(obs(pod()), at(7))
    released.then_events("SourceReleased")
    released.and_then().when(obs(pod()), at(8)).then_events("CheckpointFinished") \
        .then_phase("Failed")


def test_kill_class_deletes_the_failed_source_with_a_uid_precondition() -> None:
    """on_failure: Kill deletes the source pod (by UID) after a failed capture."""
    g = given(**{"class": {"repository": REPO, "on_failure": "Kill"}})
    g.decided(observe({f"{NS}/{POD}": pod()}), T0).decided(obs(), at(601), until_idle=False)
    then = g.when(obs(), at(602))
    then.then_events("KillRequested").then_actions("DeletePod")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    then.and_then().when(obs(pod(deleting=True)), at(603)).then_events("SourceKilled")


def test_kill_is_never_issued_on_a_probe_error() -> None:
    """Gate 3: with the source unreadable, the kill waits; at the deadline it gives up."""
    g = given(**{"class": {"repository": REPO, "on_failure": "Kill"}})
    g.decided(observe({f"{NS}/{POD}": pod()}), T0).decided(obs(), at(601), until_idle=False)
    g.when(obs(error()), at(602)).then_idle().then_no_action("DeletePod")
    end = g.when(obs(error()), at(601 + 120))
    end.then_events("CheckpointFinished").then_no_action("DeletePod")
    assert "NOT unstuck" in str(end.event("CheckpointFinished").data["message"])


def test_deadline_without_a_verified_artifact_fails_as_timeout() -> None:
    """Hang guard: no proof by the capture deadline fails the capture."""
    then = requested().when(obs(tag=None), at(600))
    assert then.event("CaptureFailed").data["reason"] == "Timeout"


def test_refused_request_fails_the_capture() -> None:
    """ActionFailed on the request annotation fails the capture (RequestRejected)."""
    g = requested().event(action_failed(f"{CID}/capture/request/1", "AnnotatePod"))
    then = g.when(obs(pod()), at(2))
    assert then.event("CaptureFailed").data["reason"] == "RequestRejected"


def test_a_request_that_met_only_transient_errors_is_written_again_with_backoff() -> None:
    """A retryable failure (429/5xx/409 past the worker's retries) is not a refusal: the
    request is written again 2 s, then 4 s, then 8 s after each attempt; the fourth
    attempt's failure ends the capture (fault campaign, seed 19)."""
    g = requested()  # attempt 1 issued at T0
    for attempt, backoff in ((1, 2), (2, 4), (3, 8)):
        issued = g.state.capture.issued_at
        g = g.event(action_failed(f"{CID}/capture/request/{attempt}", "AnnotatePod",
                                  error_class="ServerError", message="500", retryable=True))
        waiting = g.when(obs(pod()), issued + timedelta(seconds=backoff - 1)).then_idle()
        assert waiting.decision.wake_at == issued + timedelta(seconds=backoff)
        again = g.when(obs(pod()), issued + timedelta(seconds=backoff))
        again.then_events("CaptureRequested")
        assert again.action("AnnotatePod").key == f"{CID}/capture/request/{attempt + 1}"
        assert again.event("CaptureRequested").facts["error_class"] == "ServerError"
        g = again.and_then()
    g = g.event(action_failed(f"{CID}/capture/request/4", "AnnotatePod",
                              error_class="ServerError", message="500", retryable=True))
    then = g.when(obs(pod()), g.state.capture.issued_at + timedelta(seconds=16))
    assert then.event("CaptureFailed").data["reason"] == "RequestRejected"


def test_request_lost_in_a_crash_is_issued_again_with_a_new_key() -> None:
    """A request not visible on the pod after 30 s is re-issued (crash between commit/act)."""
    g = requested()
    waiting = g.when(obs(pod()), at(10)).then_idle()
    assert waiting.decision.wake_at is not None
    assert waiting.decision.wake_at <= at(30)
    then = g.when(obs(pod()), at(30))
    then.then_events("CaptureRequested")
    assert then.action("AnnotatePod").key == f"{CID}/capture/request/2"


def test_quiesced_checkpoint_succeeds_leaving_the_workload_stopped() -> None:
    """quiesce: after verification the request stays (workload stopped), no release."""
    g = given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    g.decided(obs(tag=GOOD), at(5))
    g.when(obs(tag=GOOD), at(6)).then_phase("Succeeded").then_no_action("RemovePodAnnotations")


def test_running_checkpoint_withdraws_its_request_then_succeeds() -> None:
    """Without quiesce the request is removed after verification, then Succeeded."""
    g = requested().decided(obs(tag=GOOD), at(5), until_idle=False)
    assert g.state.phase == "Verified"
    release = g.when(obs(tag=GOOD), at(5)).then_events("ReleaseRequested")
    assert release.action("RemovePodAnnotations").params["keys"] == \
        list(protocol.CAPTURE_REQUEST_KEYS)
    done = release.and_then().when(obs(pod()), at(7)).then_events("SourceReleased")
    g2 = done.and_then().decided(obs(pod()), at(7))
    assert g2.state.phase == "Succeeded"
    assert g2.state.artifact == f"{REPO}@{DIGEST}"


def test_failed_release_still_succeeds_but_says_so() -> None:
    """The checkpoint is proven; a request that could not be withdrawn is a condition."""
    g = requested().decided(obs(tag=GOOD), at(5)).decided(obs(tag=GOOD), at(6))
    g.event(action_failed(f"{CID}/source/release/1", "RemovePodAnnotations"))
    g.decided(obs(), at(7))
    assert g.state.phase == "Succeeded"
    assert [c.type for c in g.state.conditions] == ["ReleaseFailed"]


def test_cancel_withdraws_the_request_and_never_kills() -> None:
    """Cancel releases the source even when the class would kill on failure."""
    g = given(**{"class": {"repository": REPO, "on_failure": "Kill"}})
    g.decided(observe({f"{NS}/{POD}": pod()}), T0)
    then = g.when_command("Cancel", at(3)).then_events("CancelRequested")
    then.then_phase("Unsticking")
    g2 = then.and_then()
    g2.when(obs(), at(4)).then_events("ReleaseRequested").then_no_action("DeletePod")
    g2.decided(obs(), at(4)).decided(obs(pod()), at(5))
    assert g2.state.phase == "Cancelled"


def test_cancel_is_rejected_once_verified_or_finished() -> None:
    """Cancel only applies before the artifact is verified."""
    g = requested().decided(obs(tag=GOOD), at(5))
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(6))
    g.decided(obs(tag=GOOD), at(6)).decided(obs(pod()), at(7))
    with pytest.raises(CommandRejected):
        g.when_command("Cancel", at(8))


def test_terminal_checkpoint_absorbs_everything() -> None:
    """Succeeded is absorbing: no decision, and late events change nothing."""
    g = given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    g.decided(obs(tag=GOOD), at(5))
    final = g.state
    assert final.terminal
    g.when(obs(None), at(9999)).then_idle()
    d = CheckpointDecider()
    assert d.evolve(final, action_failed("x", "AnnotatePod")) == final
    assert d.evolve(final, Event("CaptureFailed", {"reason": "x", "message": "y",
                                                  "at": at(1).isoformat()})) == final


def test_source_gone_after_a_push_report_waits_for_the_registry() -> None:
    """Once a push was reported, a vanished source does not fail: the registry may prove it."""
    reported = requested_pod(**{protocol.REPORT_CHECKPOINT_ID: CID,
                                protocol.REPORT_STATE: "Pushed"})
    g = requested().decided(obs(reported), at(5))
    g.when(observe({f"{NS}/{POD}": None}, {ART: None}), at(6)).then_idle()
    g.when(observe({f"{NS}/{POD}": None}, {ART: GOOD}), at(7)).then_events("ArtifactVerified")


@pytest.mark.parametrize(("bad", "field"), [
    ({"pod": {"namespace": NS, "name": POD}}, "spec.pod.uid"),
    ({"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "artifact": "ckpt:1"},
     "spec.artifact"),
    ({"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "quiesce": "yes"}, "spec.quiesce"),
    ({"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "containers": ["a", "a"]},
     "spec.containers"),
    ({"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "colour": 1}, "colour"),
])
def test_bad_checkpoint_specs_are_rejected_naming_the_field(bad: dict[str, object],
                                                            field: str) -> None:
    """validate_spec names the offending field."""
    with pytest.raises(InvalidSpec, match=field.replace(".", r"\.")):
        CheckpointDecider().validate_spec(bad)  # type: ignore[arg-type]


def test_finishing_records_a_kubernetes_event_on_the_pod() -> None:
    """Operators see the outcome with kubectl describe pod: Normal on success."""
    g = given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    verified = g.when(obs(tag=GOOD), at(5)).then_events("ArtifactVerified")
    then = verified.and_then().when(obs(tag=GOOD), at(6)).then_phase("Succeeded")
    notice = then.action("EmitEvent")
    assert (notice.params["type"], notice.params["reason"]) == ("Normal", "CheckpointSucceeded")
    assert notice.params["object"] == {"kind": "Pod", "name": POD, "uid": SRC_UID}
    assert CID in str(notice.params["message"])



def test_a_tag_whose_signature_was_refused_is_never_pinned() -> None:
    """Gate 1 with signatures: the right id and UID under the right tag, but no trusted key
    signed it (a forged push): recorded as stale once, never verified; the real, signed
    manifest that follows is."""
    forged = dataclasses.replace(manifest(ART, digest_of("forged"), checkpoint_id=CID),
                                 signature="refused: Unsigned: no signature")
    then = requested().when(obs(tag=forged), at(5))
    then.then_events("StaleArtifactSeen").then_phase("Requested")
    assert "signature did not verify" in str(then.event("StaleArtifactSeen").data)
    assert then.event("StaleArtifactSeen").facts["tag_signature"].startswith("refused")
    signed = dataclasses.replace(GOOD, signature="verified")
    then.and_then().when(obs(tag=signed), at(6)).then_events("ArtifactVerified")
