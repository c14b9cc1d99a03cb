"""A migration whose history is behind the cluster finds its workload where it went.

A database restored from a backup remembers a migration as just started (or checkpointing)
while the cluster went on without it: the source was deleted and the workload runs restored
on the target. The capture then fails with ``SourceGone``; before calling the migration
failed, it looks for the pods its own restore attempts would have made (each attempt's
name, marked with this machine's ``restore-key``) and ends as the cluster says it did.
"""

from __future__ import annotations

from controlplane.engine.observation import Observation, PodView
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.migration.phases import restore_candidates
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import (
    NS,
    POD,
    SRC_NODE,
    TARGET,
    Given,
    at,
    error,
    migration_body,
    observe,
    pod,
)

MID = "mig-behind"
SRC = f"{NS}/{POD}"


def gone_before_capture() -> Given:
    """The history of a backup: started, and the source already gone at the first look."""
    d = MigrationDecider()
    g = Given(d, MID, d.validate_spec(migration_body({})))
    g = g.decided(observe({SRC: None}, {}), at(0), until_idle=False)
    assert g.state.phase == "Unsticking", [e.type for e in g.history]
    return g


def restored(attempt: int, *, node: str, machine: str = MID, **changes: object) -> PodView:
    name = restore_pod_name(POD, machine, attempt)
    ann = {protocol.RESTORE_KEY: f"{machine}/{attempt}",
           protocol.RESTORED_FROM_DIGEST: "sha256:" + "a" * 64,
           protocol.INSTANCE_ID: "inst-restored"}
    fields: dict[str, object] = {"uid": f"uid-r{attempt}", "node": node, "annotations": ann}
    fields.update(changes)
    return pod(name, **fields)  # type: ignore[arg-type]


def cluster(g: Given, found: dict[int, PodView | object]) -> Observation:
    """Every candidate observed: absent unless ``found`` has its attempt."""
    pods: dict[str, object] = {key: None for key in restore_candidates(g.state)}
    for attempt, p in found.items():
        pods[f"{NS}/{restore_pod_name(POD, MID, attempt)}"] = p
    return observe(pods, {})  # type: ignore[arg-type]


def test_a_source_gone_before_capture_makes_the_migration_look_for_its_restores() -> None:
    g = gone_before_capture()
    assert g.state.phase == "Unsticking"
    wanted = MigrationDecider().interests(g.state).pods
    assert SRC in wanted
    assert f"{NS}/{restore_pod_name(POD, MID, 1)}" in wanted
    assert f"{NS}/{restore_pod_name(POD, MID, 2)}" in wanted


def test_the_workload_found_restored_on_the_target_ends_the_migration_succeeded() -> None:
    g = gone_before_capture()
    then = g.when(cluster(g, {1: restored(1, node=TARGET)}), at(1))
    then.then_events("MigrationFinished").then_phase("Succeeded")
    finished = then.event("MigrationFinished")
    assert finished.data["reason"] == "FoundRestored"
    assert finished.data["final_node"] == TARGET
    assert "ahead of this history" in str(finished.data["message"])
    assert finished.facts["pod_uid"] == "uid-r1"


def test_the_workload_found_back_on_its_source_node_ends_rolled_back() -> None:
    g = gone_before_capture()
    then = g.when(cluster(g, {2: restored(2, node=SRC_NODE)}), at(1))
    then.then_phase("RolledBack")
    assert then.event("MigrationFinished").data["final_node"] == SRC_NODE


def test_a_pod_of_that_name_restored_by_another_machine_is_not_taken_for_it() -> None:
    g = gone_before_capture()
    impostor = restored(1, node=TARGET, machine="someone-else")
    then = g.when(cluster(g, {1: impostor}), at(1))
    then.then_phase("Failed")
    assert then.event("MigrationFinished").data["reason"] == "SourceGone"


def test_a_restore_not_yet_running_or_reported_failed_is_not_found() -> None:
    for p in (restored(1, node=TARGET, phase="Pending"),
              restored(1, node=TARGET, deleting=True),
              restored(1, node=TARGET, annotations={
                  protocol.RESTORE_KEY: f"{MID}/1", protocol.RESTORE_FAILURE: "boom"})):
        g = gone_before_capture()
        then = g.when(cluster(g, {1: p}), at(1))
        assert then.event("MigrationFinished").data["reason"] == "SourceGone", p


def test_nothing_found_still_fails_with_source_gone() -> None:
    g = gone_before_capture()
    g.when(cluster(g, {}), at(1)).then_phase("Failed")


def test_a_candidate_that_cannot_be_observed_is_waited_for_not_judged() -> None:
    g = gone_before_capture()
    then = g.when(cluster(g, {1: error()}), at(1))
    then.then_events()
    assert then.state.phase == "Unsticking"
