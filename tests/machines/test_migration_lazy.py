"""Given/when/then for a migration in mode ``lazy`` (issue 35, item 3): the capture (mode
lazy, handed off) and the target pod in one decision; the target verified as soon as it
runs fresh and marked; the source deleted only once both ends reported every page. Before
the target runs a failure wakes the source; after it, a lost transfer loses the workload,
said plainly, and the source is never woken. Every ``when`` also checks determinism, the
JSON round trip and replay."""

from __future__ import annotations

import json

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import NodeView, Observation, PodFact, PodView
from controlplane.machines.base.requests import Fields, Seen, SubmissionRejected
from controlplane.machines.config.classes import parse_class
from controlplane.machines.config.modes import MigrationMode, mode_refusal
from controlplane.machines.config.runtimes import RestorePath
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.migration.request import MigrationRequests
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import (
    NS,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    T0,
    TARGET,
    Given,
    action_failed,
    at,
    captured_source,
    digest_of,
    migration_body,
    node,
    observe,
    pod,
)

MID = "mig-l"
SRC = f"{NS}/{POD}"
RNAME = restore_pod_name(POD, MID, 1)
RKEY = f"{NS}/{RNAME}"
LAZY = {"mode": "lazy"}
MARKED = {**protocol.restored_from_handoff(MID, {"app": digest_of("handover archive")}),
          protocol.INSTANCE_ID: "inst-new"}
SERVED = {protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Transferred",
          **protocol.pages_report(MID, pages=2100, size=2100 * 4096, seconds=1.25)}
ARRIVED = protocol.pages_received(MID, pages=2048, expected=2048)


def given(klass: dict[str, object] | None = None, **extra: object) -> Given:
    d = MigrationDecider()
    return Given(d, MID, d.validate_spec(migration_body(klass or {}, **{**LAZY, **extra})))


def src(**ann: str) -> PodView:
    return pod(annotations={**captured_source(MID).annotations, **ann})


def released(reason: str = "Withdrawn: the request was removed; the capture was aborted"
             ) -> PodView:
    """The source after the withdrawal: the request gone, the agent's verdict on it."""
    return pod(annotations={protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Failed",
                            protocol.REPORT_REASON: reason})


def target(phase: str = "Running", *, node_name: str | None = TARGET, **ann: str) -> PodView:
    base = protocol.restore_handoff_request(checkpoint_id=MID, source=SRC, source_uid=SRC_UID,
                                            restore_key=f"{MID}/1", loader=None)
    return pod(RNAME, uid="uid-r1", node=node_name, phase=phase, annotations={**base, **ann})


def both(source: PodFact, restored: PodFact) -> Observation:
    return observe({SRC: source, RKEY: restored}, nodes={TARGET: node(TARGET)})


def started(klass: dict[str, object] | None = None, **extra: object) -> Given:
    return given(klass, **extra).decided(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}),
                                         T0)


def running(klass: dict[str, object] | None = None) -> Given:
    """The target runs restored from the lazy handoff; its pages are on their way."""
    g = started(klass).decided(both(src(), target("Pending", node_name=None)), at(1))
    return g.decided(both(src(), target(**MARKED)), at(2))


def transferred() -> Given:
    return running().decided(both(src(**SERVED), target(**MARKED, **ARRIVED)), at(3),
                             until_idle=False)


def types(g: Given) -> list[str]:
    return [e.type for e in g.history]


def lost(g: Given, source: PodFact, restored: PodFact, moment: float) -> Given:
    """Drive a lost workload to its end: the target pod removed, the source deleted."""
    g.decided(both(source, restored), at(moment))  # lost, then the target's delete
    g.decided(both(source, None), at(moment + 1))  # the target gone: delete the source
    return g.decided(both(None, None), at(moment + 2))


# --- the first decision ---------------------------------------------------------------------

def test_the_first_decision_asks_for_a_lazy_handed_off_capture_and_creates_the_target() -> None:
    then = given().when(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}), T0)
    then.then_events("Started", "CaptureRequested", "RestorePodRequested")
    then.then_phase("Checkpointing")
    ask = then.action("AnnotatePod").params["annotations"]
    assert isinstance(ask, dict)
    notes = {str(k): str(v) for k, v in ask.items()}
    assert protocol.capture_mode(notes, MID) == protocol.LAZY
    assert json.loads(notes[protocol.CAPTURE_HANDOFF]) == {"checkpoint": MID, "target": TARGET}
    create = then.action("CreatePod").params
    assert create["node"] == TARGET
    ann = create["annotations"]
    assert isinstance(ann, dict)
    assert protocol.RESTORE_ARTIFACT not in ann
    assert protocol.restore_handoff(ann) == protocol.RestoreHandoff(MID, NS, POD, SRC_UID)
    template = create["template"]
    assert isinstance(template, dict)
    assert "labels" not in template["metadata"]  # parked until the source is gone
    assert then.state.spec.lazy
    assert not then.state.spec.keep_name


def test_a_cri_o_target_gets_a_pod_naming_the_hand_over_checkpoint_image() -> None:
    """CRI-O restores only a checkpoint image: the target pod names, from the start, the
    tag the target's agent pushes the memory-less hand-over to (``repo:lazy-<id>-<c>``);
    the rest of the first decision is the agent nodes' one."""
    crio = NodeView(name=TARGET, ready=True, runtime="cri-o://1.36.3")
    then = given().when(observe({SRC: pod()}, nodes={TARGET: crio}), T0)
    then.then_events("Started", "CaptureRequested", "RestorePodRequested")
    create = then.action("CreatePod").params
    ann = create["annotations"]
    assert isinstance(ann, dict)
    assert protocol.restore_handoff(ann) == protocol.RestoreHandoff(MID, NS, POD, SRC_UID)
    assert create["images"] == {"app": f"{REPO}:lazy-{MID}-app"}


def test_a_class_default_mode_lazy_applies_and_ignores_the_transfer() -> None:
    d = MigrationDecider()
    g = Given(d, MID, d.validate_spec(migration_body({"migration_mode": "lazy",
                                                      "transfer": "registry"})))
    then = g.when(observe({SRC: pod()}, nodes={TARGET: node(TARGET)}), T0)
    then.then_events("Started", "CaptureRequested", "RestorePodRequested")
    assert then.state.spec.lazy
    assert parse_class({"migration_mode": "lazy"}).migration_mode is MigrationMode.LAZY


# --- the target runs ------------------------------------------------------------------------

def test_the_target_runs_only_when_fresh_and_marked_for_this_checkpoint() -> None:
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    # Running but not marked yet, or marked without a fresh instance id: waiting.
    g.when(both(src(), target()), at(2)).then_idle()
    unfresh = {k: v for k, v in MARKED.items() if k != protocol.INSTANCE_ID}
    g.when(both(src(), target(**unfresh)), at(2)).then_idle()
    other = {**protocol.restored_from_handoff("another", {"app": digest_of("x")}),
             protocol.INSTANCE_ID: "inst-new"}
    g.when(both(src(), target(**other)), at(2)).then_idle()
    then = g.when(both(src(), target(**MARKED)), at(2)).then_events("RestoreVerified")
    assert then.event("RestoreVerified").data["digest"] is None
    then.then_phase("TargetRunning")
    assert then.state.final_node == TARGET
    assert "ArtifactVerified" not in types(then.and_then())


def test_pages_transferred_needs_both_reports_and_equal_counts() -> None:
    g = running()
    g.when(both(src(**SERVED), target(**MARKED)), at(3)).then_idle()  # target not done
    g.when(both(src(), target(**MARKED, **ARRIVED)), at(3)).then_idle()  # source not done
    then = g.when(both(src(**SERVED), target(**MARKED, **ARRIVED)), at(3))
    then.then_events("PagesTransferred").then_phase("DeletingSource")
    assert then.event("PagesTransferred").data == {
        "at": then.event("PagesTransferred").data["at"], "pages": 2048,
        "bytes": 2100 * 4096, "seconds": 1.25}
    then.then_no_action("DeletePod")  # recorded first, the source deleted next


def test_the_source_is_deleted_only_after_pages_transferred_then_labels_then_succeeded() -> None:
    g = running()
    for moment in (3, 4):  # while pages arrive: no delete, whatever the source says
        g.when(both(src(), target(**MARKED)), at(moment)).then_no_action("DeletePod")
    g = transferred()
    then = g.when(both(src(**SERVED), target(**MARKED, **ARRIVED)), at(4))
    then.then_events("SourceDeletionRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    then.then_no_action("AnnotatePod")
    g = then.and_then()
    end = g.when(both(None, target(**MARKED, **ARRIVED)), at(5)).then_events("SourceDeleted")
    g = end.and_then()
    done = g.when(both(None, target(**MARKED, **ARRIVED)), at(5))
    done.then_events("MigrationFinished").then_phase("Succeeded")
    labels = done.action("AnnotatePod").params
    assert labels["labels"] == {"app": "web"}
    assert labels["uid"] == "uid-r1"
    g = done.and_then()
    assert g.state.final_node == TARGET
    seen = types(g)
    assert seen.index("RestoreVerified") < seen.index("PagesTransferred") \
        < seen.index("SourceDeletionRequested") < seen.index("SourceDeleted")
    assert not {"ArtifactVerified", "ArtifactDeletionRequested", "ReleaseRequested"} & set(seen)
    assert "no checkpoint kept" in str(g.history[-1].data["message"])


def test_the_target_may_report_every_page_once_the_source_pod_is_gone() -> None:
    """The source pod deleted by someone after every page arrived: no loss."""
    then = running().when(both(None, target(**MARKED, **ARRIVED)), at(3))
    then.then_events("PagesTransferred")
    assert then.event("PagesTransferred").data.get("bytes") is None


# --- failures before the target runs: the source wakes -------------------------------------

def test_a_failed_capture_before_the_target_runs_removes_it_and_unsticks_the_source() -> None:
    failed = src(**{protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Failed",
                    protocol.REPORT_REASON: "Refused: no userfaultfd"})
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(failed, target("Pending")), at(2), until_idle=False)
    assert g.state.phase == "Unsticking"
    g.decided(both(failed, target("Pending")), at(2))
    g.decided(both(failed, None), at(3)).decided(both(released(), None), at(4))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "AgentFailed"
    assert "SourceDeletionRequested" not in types(g)
    assert types(g).index("RestoreCleanedUp") < types(g).index("ReleaseRequested")


def test_a_failed_restore_before_the_target_runs_withdraws_the_capture() -> None:
    broken = target(**{protocol.RESTORE_FAILURE: "RestoreFailed: criu restore"})
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(src(), broken), at(2), until_idle=False)
    g.decided(both(src(), broken), at(2), until_idle=False)
    assert g.state.phase == "WakingInPlace"
    assert types(g)[-1] == "HandoffAbandoned"
    g.decided(both(src(), broken), at(3))
    g.decided(both(src(), None), at(4)).decided(both(released(), None), at(5))
    assert g.state.phase == "Failed"
    assert "workload resumed in place" in g.state.failure.message
    assert g.state.final_node == SRC_NODE
    assert "ReleaseRequested" in types(g)


def test_the_capture_deadline_before_the_target_runs_wakes_the_source() -> None:
    g = started({"timeouts": {"capture": 30}}).decided(
        both(src(), target("Pending", node_name=None)), at(1))
    then = g.when(both(src(), target("Pending")), at(30)).then_events("CaptureFailed")
    assert "did not run" in str(then.event("CaptureFailed").data["message"])
    g = then.and_then()
    assert g.state.phase == "Unsticking"
    g.decided(both(src(), target("Pending")), at(30))
    g.decided(both(src(), None), at(31)).decided(both(released(), None), at(32))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "Timeout"
    assert "ReleaseRequested" in types(g)


def test_cancel_before_the_target_runs_wakes_the_source() -> None:
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.command("Cancel", at(2))
    assert g.state.phase == "WakingInPlace"
    g.decided(both(src(), target("Pending")), at(2))
    g.decided(both(src(), None), at(3)).decided(both(released(), None), at(4))
    assert g.state.phase == "Cancelled"
    assert "SourceDeletionRequested" not in types(g)


def test_a_withdrawal_that_came_too_late_reports_the_workload_lost() -> None:
    """The target failed after its daemon reached the page server: CRIU ended the source,
    whose agent answers the withdrawal with PagesLost. Not "resumed in place"."""
    broken = target(**{protocol.RESTORE_FAILURE: "RestoreFailed: criu restore"})
    g = started().decided(both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(src(), broken), at(2)).decided(both(src(), None), at(3))
    assert g.state.phase == "WakingInPlace"
    g.decided(both(pod(), None), at(4))
    assert "SourceReleased" in types(g)
    assert g.state.phase == "WakingInPlace"  # released: the agent's verdict is awaited
    g.when(both(pod(), None), at(4)).then_idle()
    g.decided(both(released("PagesLost: the daemon connected"), None), at(5))
    g.decided(both(None, None), at(6))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "WorkloadLost"
    assert "the workload is gone" in g.state.failure.message


def test_without_a_verdict_the_withdrawal_is_trusted_after_the_release_timeout() -> None:
    broken = target(**{protocol.RESTORE_FAILURE: "RestoreFailed: criu restore"})
    g = started({"timeouts": {"release": 20}}).decided(
        both(src(), target("Pending", node_name=None)), at(1))
    g.decided(both(src(), broken), at(2)).decided(both(src(), None), at(3))
    g.decided(both(pod(), None), at(4))
    assert g.state.phase == "WakingInPlace"
    g.decided(both(pod(), None), at(3 + 20))
    assert g.state.phase == "Failed"
    assert "workload resumed in place" in g.state.failure.message


# --- after the target runs: the workload is lost, never woken ------------------------------

def _assert_lost(g: Given, why: str) -> None:
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "WorkloadLost"
    assert "the workload is gone" in g.state.failure.message
    assert why in g.state.failure.message
    assert g.state.final_node is None
    seen = types(g)
    assert "ReleaseRequested" not in seen  # never woken
    assert seen.index("WorkloadLost") < seen.index("RestoredPodDeletionRequested") \
        < seen.index("SourceDeletionRequested")


def test_pages_lost_on_the_target_loses_the_workload() -> None:
    lost_target = target(**MARKED, **{protocol.RESTORE_FAILURE: "PagesLost: daemon died"})
    g = running()
    then = g.when(both(src(), lost_target), at(3)).then_events("WorkloadLost", "RestoreFailed")
    assert then.decision.confirm  # taken only on a fresh read
    then.then_phase("ClearingLostWorkload")
    _assert_lost(lost(g, src(), lost_target, 3), "PagesLost")


def test_pages_lost_on_the_source_loses_the_workload() -> None:
    failed = src(**{protocol.REPORT_CHECKPOINT_ID: MID, protocol.REPORT_STATE: "Failed",
                    protocol.REPORT_REASON: "PagesLost: the daemon left"})
    g = running()
    _assert_lost(lost(g, failed, target(**MARKED), 3), "the daemon left")


def test_the_transfer_deadline_loses_the_workload() -> None:
    """The transfer deadline is the class's restore timeout from the target running."""
    g = running({"timeouts": {"restore": 40, "schedule": 10}})
    assert g.state.transfer_deadline == at(2 + 40)
    g.when(both(src(), target(**MARKED)), at(41)).then_idle()
    _assert_lost(lost(g, src(), target(**MARKED), 42), "TransferTimeout")


def test_unequal_counts_lose_the_workload() -> None:
    short = protocol.pages_received(MID, pages=2000, expected=2048)
    g = running()
    _assert_lost(lost(g, src(**SERVED), target(**MARKED, **short), 3), "2000 of the 2048")


def test_cancel_and_retarget_after_the_target_runs_are_refused_naming_why() -> None:
    g = running()
    with pytest.raises(CommandRejected, match="lazy and its target runs"):
        g.when_command("Cancel", at(3))
    with pytest.raises(CommandRejected, match="cannot be woken"):
        g.when_command("Retarget", at(3), node=SRC_NODE)


def test_a_source_that_cannot_be_deleted_after_the_pages_is_never_woken() -> None:
    g = transferred().decided(both(src(**SERVED), target(**MARKED, **ARRIVED)), at(4))
    g.event(action_failed(f"{MID}/source/delete/1", "DeletePod"))
    g.decided(both(src(**SERVED), target(**MARKED, **ARRIVED)), at(5))
    assert g.state.phase == "Failed"
    assert g.state.failure.reason == "SourceNotDeleted"
    assert g.state.final_node == TARGET
    assert "ReleaseRequested" not in types(g)


# --- refused at submission ------------------------------------------------------------------

POD_SEEN = {"metadata": {"namespace": "default", "name": "web", "uid": "u-1", "labels": {}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app:1"}]}}


def _submitted(klass: dict[str, object], runtime: str = "") -> None:
    fields = Fields({"workload": "default/web", "targetNode": "node-2", "class": klass,
                     "mode": "lazy"})
    spec = MigrationRequests().of(fields).build(Seen(pods={"default/web": POD_SEEN})).spec
    seen = observe({"default/web": pod("web", uid="u-1", node="node-1")},
                   nodes={n: NodeView(name=n, ready=True, runtime=runtime)
                          for n in ("node-1", "node-2")})
    MigrationRequests().check(spec, seen)


def test_lazy_is_taken_at_submission_by_agent_and_cri_o_nodes() -> None:
    _submitted({"repository": "localhost:5000/ckpt"}, runtime="cri-o://1.36.3")
    _submitted({"repository": "localhost:5000/ckpt"})  # agent nodes take it
    assert mode_refusal(MigrationMode.LAZY, RestorePath.AGENT, node="n") is None
    assert mode_refusal(MigrationMode.LAZY, RestorePath.RUNTIME, node="n") is None


def test_lazy_with_a_sealed_class_is_refused_at_submission() -> None:
    sealed = {"repository": "localhost:5000/ckpt",
              "encryption": {"recipients": ["-----BEGIN PUBLIC KEY-----\nMFkw...\n"
                                            "-----END PUBLIC KEY-----\n"],
                             "keySecretRef": {"name": "checkpoint-keys", "key": "k.pem"}}}
    with pytest.raises(SubmissionRejected, match="plain TCP"):
        _submitted(sealed)
    assert mode_refusal(MigrationMode.LAZY, RestorePath.AGENT, node="n", sealed=True)


def test_a_statefulset_pod_cannot_move_lazily() -> None:
    d = MigrationDecider()
    with pytest.raises(InvalidSpec, match="StatefulSet"):
        d.validate_spec(migration_body({}, mode="lazy", successor="gated"))
