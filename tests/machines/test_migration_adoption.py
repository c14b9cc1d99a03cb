"""Given/when/then for a ReplicaSet pod's migration (``successor: adopt``).

The restored pod starts beside the quiesced source with its labels parked, is handed
to the ReplicaSet once verified (the source made the cheapest to delete, the labels
given back), and only once it is observed owned is the source deleted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.engine.decider import CommandRejected, InvalidSpec
from controlplane.engine.observation import Observation, PodView
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.migration.phases import CHEAPEST, DELETION_COST
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import (
    NS,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    T0,
    TARGET,
    TEMPLATE,
    Given,
    at,
    captured_source,
    migration_artifact,
    migration_body,
    node,
    observe,
    pod,
)

MID = "mig-rs"
ART, DIGEST, PINNED, GOOD = migration_artifact(MID)
SRC = f"{NS}/{POD}"
NAME = restore_pod_name(POD, MID, 1)
RESTORED = f"{NS}/{NAME}"
FRESH = {protocol.RESTORED_FROM_DIGEST: DIGEST, protocol.INSTANCE_ID: "inst-new"}


def given(**klass: object) -> Given:
    d = MigrationDecider()
    return Given(d, MID, d.validate_spec(migration_body(klass, successor="adopt")))


def src(**kw: object) -> PodView:
    return captured_source(MID, **kw)


def restored(*, phase: str = "Running", node_name: str | None = TARGET,
             owner: str = "", labels: dict[str, str] | None = None,
             fresh: bool = True, deleting: bool = False) -> PodView:
    ann = {protocol.RESTORE_KEY: f"{MID}/1", protocol.RESTORE_ARTIFACT: PINNED,
           **(FRESH if fresh else {})}
    p = pod(NAME, uid="uid-r1", node=node_name, phase=phase, annotations=ann,
            deleting=deleting)
    return replace(p, controller=owner, labels=labels or {})


def seen(source: object, restored_pod: object, **tags: object) -> Observation:
    return observe({SRC: source, RESTORED: restored_pod},  # type: ignore[dict-item]
                   dict(tags), nodes={TARGET: node(TARGET)})  # type: ignore[arg-type]


def artifact_verified(**klass: object) -> Given:
    g = given(**klass).decided(observe({SRC: pod()}, {ART: None}), T0)
    return g.decided(observe({SRC: src()}, {ART: GOOD}), at(5), until_idle=False)


def restoring(**klass: object) -> Given:
    return artifact_verified(**klass).decided(seen(src(), None), at(5))


def adopting(**klass: object) -> Given:
    g = restoring(**klass).decided(seen(src(), restored(phase="Pending", node_name=None,
                                                         fresh=False)), at(6))
    return g.decided(seen(src(), restored()), at(7), until_idle=False)


def test_a_replicaset_pod_is_restored_beside_its_source_before_anything_is_deleted() -> None:
    then = restoring()
    assert then.state.phase == "Restoring"
    assert artifact_verified().state.phase == "Restoring"
    create = artifact_verified().when(seen(src(), None), at(5))
    create.then_events("RestorePodRequested").then_no_action("DeletePod")


def test_the_restored_pod_starts_without_labels_so_its_replicaset_does_not_count_it() -> None:
    then = artifact_verified().when(seen(src(), None), at(5))
    template = then.action("CreatePod").params["template"]
    assert isinstance(template, dict)
    assert "labels" not in template["metadata"]  # type: ignore[operator]
    assert TEMPLATE["metadata"]["labels"] == {"app": "web"}  # type: ignore[index]


def test_once_verified_the_source_is_made_cheapest_and_the_labels_handed_back() -> None:
    g = adopting()
    assert g.state.phase == "Adopting"
    then = g.when(seen(src(), restored()), at(8))
    then.then_events("AdoptionRequested").then_no_action("DeletePod")
    cost, labels = then.decision.actions
    assert cost.params["uid"] == SRC_UID
    assert cost.params["annotations"] == {DELETION_COST: CHEAPEST}
    assert labels.params["uid"] == "uid-r1"
    assert labels.params["labels"] == {"app": "web"}


def test_the_source_is_deleted_only_after_the_restored_pod_is_seen_owned() -> None:
    g = adopting().decided(seen(src(), restored()), at(8))
    unowned = g.when(seen(src(), restored(labels={"app": "web"})), at(9))
    unowned.then_idle().then_no_action("DeletePod")
    owned = restored(labels={"app": "web"}, owner="ReplicaSet/web-abc")
    then = g.when(seen(src(), owned), at(9))
    then.then_events("Adopted")
    then = then.and_then().when(seen(src(), owned), at(9))
    then.then_events("SourceDeletionRequested")
    assert then.action("DeletePod").params["uid"] == SRC_UID
    done = then.and_then().when(seen(None, owned, **{PINNED: GOOD}), at(10))
    done.then_events("SourceDeleted").then_phase("CollectingGarbage")


def test_a_source_its_replicaset_already_removed_needs_no_delete() -> None:
    owned = restored(labels={"app": "web"}, owner="ReplicaSet/web-abc")
    g = adopting().decided(seen(src(), restored()), at(8)).decided(seen(src(), owned), at(9),
                                                                    until_idle=False)
    then = g.when(seen(src(deleting=True), owned), at(9))
    then.then_events("SourceVanished").then_phase("CollectingGarbage").then_no_action(
        "DeletePod")


def test_the_handover_is_reissued_and_then_fails_loudly_keeping_both_pods() -> None:
    g = adopting(timeouts={"delete": 60}).decided(seen(src(), restored()), at(8))
    again = g.when(seen(src(), restored()), at(40))
    again.then_events("AdoptionRequested")
    late = again.and_then().when(seen(src(), restored()), at(80))
    late.then_phase("Failed").then_no_action("DeletePod")
    assert "not adopted" in late.state.to_json()["failure"]["message"]  # type: ignore[index]


def test_a_failed_restore_beside_the_source_wakes_the_source_in_place() -> None:
    g = restoring(restore_attempts=1)
    failed = pod(NAME, uid="uid-r1", node=TARGET, phase="Failed",
                 annotations={protocol.RESTORE_KEY: f"{MID}/1",
                              protocol.RESTORE_FAILURE: "criu said no"})
    g = g.decided(seen(src(), failed), at(6))
    g = g.decided(seen(src(), None), at(7))
    assert [e.type for e in g.history][-5:] == [
        "RestoreFailed", "RestoredPodDeletionRequested", "RestoreCleanedUp",
        "AdoptionAbandoned", "ReleaseRequested"]
    assert g.state.phase == "WakingInPlace"
    then = g.when(seen(src(), None), at(8))
    then.then_idle().then_no_action("DeletePod")  # the source is never deleted
    woken = then.and_then().decided(seen(pod(), None), at(9))
    assert [e.type for e in woken.history][-2:] == ["SourceReleased", "MigrationFinished"]
    assert woken.state.phase == "Failed"
    message = woken.state.to_json()["failure"]["message"]  # type: ignore[index]
    assert "criu said no" in message
    assert "resumed in place" in message


def test_cancel_is_refused_once_the_restored_pod_is_being_handed_over() -> None:
    with pytest.raises(CommandRejected, match="already restored"):
        adopting().command("Cancel", at(8))


def test_successor_must_be_adopt_and_excludes_keep_name() -> None:
    d = MigrationDecider()
    body = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "source_node": SRC_NODE,
            "target_node": TARGET, "template": TEMPLATE, "class": {"repository": REPO}}
    with pytest.raises(InvalidSpec, match=r"spec\.successor"):
        d.validate_spec({**body, "successor": "steal"})
    with pytest.raises(InvalidSpec, match="exclude each other"):
        d.validate_spec({**body, "successor": "adopt", "keep_name": True})
