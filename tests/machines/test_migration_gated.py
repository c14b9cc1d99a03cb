"""Given/when/then for a StatefulSet pod's migration (``successor: gated``).

The source is deleted as for a bare pod; then nothing is created: the controller
recreates the same name, the webhook holds that successor with a scheduling gate, and
the migration claims it (restore request, node affinity to the target, gate removed),
then proves the restore as for a created pod."""

from __future__ import annotations

from dataclasses import replace

from controlplane.engine.observation import Observation, PodView
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from tests.machines.machines_gwt import (
    NS,
    POD,
    T0,
    TARGET,
    Given,
    at,
    captured_source,
    migration_artifact,
    migration_body,
    node,
    observe,
    pod,
)

MID = "mig-sts"
ART, DIGEST, PINNED, GOOD = migration_artifact(MID)
SRC = f"{NS}/{POD}"
FRESH = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "inst-new"}


def given(**klass: object) -> Given:
    d = MigrationDecider()
    return Given(d, MID, d.validate_spec(migration_body(klass, successor="gated")))


def src(**kw: object) -> PodView:
    return captured_source(MID, **kw)


def successor(*, gated: bool = True, claimed: bool = False, node_name: str | None = None,
              phase: str = "Pending", fresh: bool = False) -> PodView:
    ann = {protocol.RESTORE_KEY: f"{MID}/1", protocol.RESTORE_ARTIFACT: PINNED} \
        if claimed else {}
    if fresh:
        ann.update(FRESH)
    p = pod(POD, uid="uid-succ", node=node_name, phase=phase, annotations=ann)
    return replace(p, gates=(protocol.RESTORE_GATE,) if gated else ())


def seen(p: object) -> Observation:
    return observe({SRC: p}, {PINNED: GOOD}, nodes={TARGET: node(TARGET)})  # type: ignore[dict-item]


def restoring(**klass: object) -> Given:
    g = given(**klass).decided(observe({SRC: pod()}, {ART: None}), T0)
    g = g.decided(observe({SRC: src()}, {ART: GOOD}), at(5))
    return g.decided(seen(src()), at(6)).decided(seen(None), at(7))


def test_the_source_goes_first_and_no_pod_is_created() -> None:
    g = restoring()
    assert g.state.phase == "Restoring"
    then = g.when(seen(None), at(8))
    then.then_idle().then_no_action("CreatePod", "ClaimPod")


def test_the_gated_successor_is_claimed_for_the_target_with_the_restore_request() -> None:
    then = restoring().when(seen(successor()), at(8))
    then.then_events("RestorePodRequested")
    claim = then.action("ClaimPod")
    assert claim.params["uid"] == "uid-succ"
    assert claim.params["node"] == TARGET
    assert claim.params["gate"] == protocol.RESTORE_GATE
    annotations = claim.params["annotations"]
    assert isinstance(annotations, dict)
    assert annotations[protocol.RESTORE_KEY] == f"{MID}/1"
    assert annotations[protocol.RESTORE_ARTIFACT] == PINNED


def test_the_claim_is_not_repeated_at_once_but_is_after_a_while() -> None:
    g = restoring().decided(seen(successor()), at(8))
    g.when(seen(successor()), at(9)).then_idle().then_no_action("ClaimPod")
    g.when(seen(successor()), at(40)).then_events("RestorePodRequested")


def test_a_claimed_successor_is_verified_like_a_created_restore() -> None:
    g = restoring().decided(seen(successor()), at(8))
    g = g.decided(seen(successor(gated=False, claimed=True, node_name=TARGET)), at(9))
    then = g.when(seen(successor(gated=False, claimed=True, node_name=TARGET,
                                 phase="Running", fresh=True)), at(10))
    then.then_events("RestoreVerified").then_phase("CollectingGarbage")
    assert then.state.final_node == TARGET


def test_a_successor_recreated_without_the_gate_fails_the_attempt_and_is_left_alone() -> None:
    then = restoring().when(seen(successor(gated=False, node_name=TARGET, phase="Running")),
                            at(8))
    then.then_events("RestoreFailed").then_no_action("ClaimPod", "DeletePod")
    assert "without the checkpoint.controlplane.dev/restore scheduling gate" in str(
        then.events[0].data["message"])


def test_a_successor_that_never_comes_fails_the_attempt_at_the_schedule_deadline() -> None:
    then = restoring(timeouts={"schedule": 30}).when(seen(None), at(40))
    then.then_events("RestoreFailed")
    assert "did not recreate" in str(then.events[0].data["message"])


def test_the_terminating_source_is_never_claimed() -> None:
    then = restoring().when(seen(src(deleting=True)), at(8))
    then.then_idle().then_no_action("ClaimPod")


def test_out_of_attempts_the_failure_says_the_successor_may_be_held_by_the_gate() -> None:
    g = restoring(restore_attempts=1).decided(
        seen(successor(gated=False, node_name=TARGET, phase="Running")), at(8))
    assert g.state.phase == "Failed"
    message = g.state.failure.message
    assert "preserved for a manual restore" in message
    assert "held by the scheduling gate checkpoint.controlplane.dev/restore" in message
