"""The mirror's status, from real operation records: every kind's terminal phases map to
Succeeded or Failed with the reason the machine recorded; nothing is Succeeded or Failed
before the operation settled; a refused spec is Accepted=False; a condition keeps its
transition time until its status flips; and a status is rewritten exactly when what the
mirror owns differs (lost, edited, stale), never when it is unchanged.

The records are real: the successes are the rows the product wrote end to end
(``tests/golden/todays_rows.sqlite``, every kind), the other endings are histories the
real deciders made, built with the machine tests' own given/when/then scenarios.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from controlplane.frontdoor.status import (
    KINDS,
    OWNED,
    Refusal,
    desired_status,
    needs_write,
    rfc3339,
    status_patch,
)
from controlplane.machines.catalog import product_kinds
from controlplane.machines.stages.restore import restore_pod_name
from controlplane.store.records import MachineRecord
from tests.golden.todays_rows import ROWS
from tests.machines import test_checkpoint_machine as ckpt
from tests.machines import test_drain_machine as drn
from tests.machines import test_migration_machine as mig
from tests.machines import test_restore_machine as rst
from tests.machines import test_suspend_resume_machines as sus
from tests.machines.machines_gwt import (
    NS,
    POD,
    SRC_NODE,
    T0,
    TARGET,
    Given,
    action_failed,
    at,
    node,
    observe,
    pod,
)

NOW = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
DONE = T0 + timedelta(minutes=2, microseconds=999)


def record(g: Given, *, settled: bool = True, pending: bool = False,
           held: bool = False) -> MachineRecord:
    """``g``'s machine as its ``machines`` row: settled (terminal, no lease, nothing due)
    unless told otherwise (``pending``: its last actions not performed yet, so it is due)."""
    state = g.state
    return MachineRecord(
        id=state.machine_id, kind=g.decider.kind, phase=state.phase, version=len(g.history),
        spec=g.spec, state=state.to_json(), terminal=state.terminal,
        pending_actions=[{"type": "EmitEvent"}] if pending else [],
        next_wake_at=DONE if pending else None, wake_seq=0,
        lease_owner=None if settled else "worker-1",
        lease_expires_at=None, attempts=0, created_at=T0, updated_at=DONE, held=held)


@cache
def recorded() -> dict[str, MachineRecord]:
    """The rows the product wrote end to end, by kind (the finished migration: its own,
    not the drain's child, nor the cancelled one)."""
    out: dict[str, MachineRecord] = {}
    # immutable: a reader of this WAL-mode file leaves no -wal/-shm beside it
    with closing(sqlite3.connect(f"file:{ROWS}?mode=ro&immutable=1", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        for r in conn.execute("SELECT * FROM machines ORDER BY created_at"):
            key = r["kind"] if r["phase"] != "Cancelled" else f"{r['kind']}/Cancelled"
            out.setdefault(key, MachineRecord(
                r["id"], r["kind"], r["phase"], r["version"], json.loads(r["spec"]),
                json.loads(r["state"]), bool(r["terminal"]), json.loads(r["pending_actions"]),
                None, r["wake_seq"], r["lease_owner"], None, r["attempts"], _utc(r["created_at"]),
                _utc(r["updated_at"]), r["workload"], r["source_node"], bool(r["held"])))
    return out


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def status(kind: str, operation: MachineRecord | None, *, resume: MachineRecord | None = None,
           previous: dict[str, Any] | None = None, now: datetime = NOW,
           generation: int = 1, refusal: Refusal | None = None) -> dict[str, Any]:
    return desired_status(kind, generation=generation, operation=operation, resume=resume,
                          refusal=refusal, previous=previous, now=now)


def conditions(s: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}


def message(s: dict[str, Any], type_: str) -> str:
    return str(next(c["message"] for c in s["conditions"] if c["type"] == type_))


def ended(s: dict[str, Any], *, succeeded: bool, reason: str, phase: str) -> None:
    """The shape of every settled operation's conditions."""
    assert conditions(s) == {
        "Accepted": ("True", "OperationCreated"), "Progressing": ("False", phase),
        "Succeeded": ("True" if succeeded else "False", reason),
        "Failed": ("False" if succeeded else "True", reason)}
    assert s["phase"] == phase


def test_the_kinds_are_the_five_operations_over_every_product_machine_kind() -> None:
    machines = {k.machine for k in KINDS.values()} | {k.resume for k in KINDS.values()
                                                      if k.resume}
    assert set(KINDS) == {"Checkpoint", "Restore", "Migration", "Suspension", "Drain"}
    assert machines == {d.kind for d in product_kinds()}
    assert KINDS["Suspension"].resume == "resume"


# -- successes: the rows the product wrote --------------------------------------------------

@pytest.mark.parametrize(("kind", "machine", "reason", "phase"), [
    ("Checkpoint", "checkpoint", "Verified", "Succeeded"),
    ("Restore", "restore", "Verified", "Succeeded"),
    ("Migration", "migration", "Migrated", "Succeeded"),
    ("Suspension", "suspend", "Suspended", "Suspended"),
    ("Drain", "drain", "Drained", "Succeeded"),
])
def test_a_recorded_success_is_succeeded_with_the_machines_reason_and_times(
        kind: str, machine: str, reason: str, phase: str) -> None:
    op = recorded()[machine]
    s = status(kind, op, generation=4)
    ended(s, succeeded=True, reason=reason, phase=phase)
    assert s["operationID"] == op.id
    assert s["observedGeneration"] == 4
    assert {c["observedGeneration"] for c in s["conditions"]} == {4}
    assert s["startTime"] == rfc3339(op.created_at)
    assert s["completionTime"] == rfc3339(op.updated_at)
    assert set(s) <= set(OWNED)


def test_a_capture_reports_its_tag_and_the_digest_the_registry_proved() -> None:
    for machine, kind in (("checkpoint", "Checkpoint"), ("suspend", "Suspension"),
                          ("migration", "Migration")):
        op = recorded()[machine]
        capture = op.state["capture"]
        spec = op.state["spec"]
        tag = (spec["capture"] if machine == "migration" else spec)["artifact"]
        assert status(kind, op)["checkpoint"] == {"artifact": tag, "digest": capture["digest"]}
    assert "checkpoint" not in status("Restore", recorded()["restore"])
    assert "checkpoint" not in status("Drain", recorded()["drain"])


def test_the_pod_is_the_one_the_operation_left_running() -> None:
    rows = recorded()
    plan = rows["migration"].state["restore"]["plan"]
    assert status("Migration", rows["migration"])["pod"] == \
        f"{plan['namespace']}/{plan['pod_name']}"
    assert status("Restore", rows["restore"])["pod"] == "default/web-copy"
    # A checkpoint leaves its source running: that is its pod (issue 41: one field set)
    assert status("Checkpoint", rows["checkpoint"])["pod"] == rows["checkpoint"].workload
    assert "pod" not in status("Suspension", rows["suspend"])  # not resumed yet


def test_a_drain_counts_its_children_as_the_api_does() -> None:
    s = status("Drain", recorded()["drain"])
    assert s["drain"] == {"children": 1, "succeeded": 1, "failed": 0, "running": 0,
                          "pending": 0, "skipped": 0}
    assert message(s, "Succeeded").startswith("moved 1 pods off node-3")


# -- the other endings, as the real deciders made them --------------------------------------

def test_a_checkpoint_of_a_vanished_pod_fails_with_the_captures_reason() -> None:
    g = ckpt.given().decided(observe({f"{NS}/{POD}": None}), T0)
    g.decided(observe({f"{NS}/{POD}": None}), at(1))
    ended(status("Checkpoint", record(g)), succeeded=False, reason="SourceGone",
          phase="Failed")


def test_a_cancelled_checkpoint_is_failed_with_reason_cancelled() -> None:
    g = ckpt.given().decided(observe({f"{NS}/{POD}": pod()}), T0).command("Cancel", at(3))
    g.decided(ckpt.obs(), at(4)).decided(ckpt.obs(pod()), at(5))
    s = status("Checkpoint", record(g))
    ended(s, succeeded=False, reason="Cancelled", phase="Cancelled")
    assert message(s, "Failed") == "cancelled by the operator"


def test_a_quiesced_checkpoint_says_the_workload_was_left_stopped() -> None:
    g = ckpt.given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    g.decided(ckpt.obs(tag=ckpt.GOOD), at(5))
    s = status("Checkpoint", record(g))
    ended(s, succeeded=True, reason="Verified", phase="Succeeded")
    assert "left stopped" in message(s, "Succeeded")
    assert s["checkpoint"] == {"artifact": ckpt.ART, "digest": ckpt.DIGEST}


def test_a_restore_of_a_missing_artifact_fails_as_artifact_missing() -> None:
    g = rst.given().decided(observe(tags={rst.PINNED: None}), T0)
    s = status("Restore", record(g))
    ended(s, succeeded=False, reason="ArtifactMissing", phase="Failed")
    assert "does not exist" in message(s, "Failed")
    assert "pod" not in s


def test_a_restore_cancelled_mid_flight_says_cancelled_not_the_attempts_reason() -> None:
    """The machine ends on its abandoned attempt's reason (Superseded); a cancel is
    reported as Cancelled."""
    pending = rst.ours(phase="Pending", node_name=None)
    g = rst.restoring().decided(rst.obs(pending), at(2)).command("Cancel", at(3))
    g.decided(rst.obs(pending), at(3)).decided(rst.obs(None), at(4))
    ended(status("Restore", record(g)), succeeded=False, reason="Cancelled",
          phase="Cancelled")


def test_a_migration_whose_capture_timed_out_fails_with_that_reason() -> None:
    g = mig.given().decided(observe({mig.SRC: pod()}, {mig.ART: None}), T0)
    g.decided(observe({mig.SRC: mig.src()}, {mig.ART: None}), at(600))
    g.decided(observe({mig.SRC: pod()}), at(601))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="Timeout", phase="Failed")
    assert s["checkpoint"] == {"artifact": mig.ART}  # no digest: nothing was verified


def test_a_migration_out_of_restore_attempts_fails_as_restore_failed() -> None:
    g = mig.restoring(restore_attempts=2)
    g.decided(mig.at_restore(1, mig.restored(phase="Failed")), at(8))
    g.decided(mig.at_restore(1, None), at(9))
    g.decided(mig.at_restore(2, mig.restored(2, node_name=SRC_NODE, phase="Failed"),
                             SRC_NODE), at(10))
    g.decided(mig.at_restore(2, None, SRC_NODE), at(11))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="RestoreFailed", phase="Failed")
    assert mig.PINNED in message(s, "Failed")
    assert "pod" not in s


def test_a_migration_whose_artifact_could_not_be_deleted_is_not_a_success() -> None:
    """Gate 7: the workload moved, but a failed garbage collection is never reported as
    a clean success."""
    g = mig.verified().decided(observe(tags={mig.PINNED: mig.GOOD}), at(10))
    g.event(action_failed(f"{mig.MID}/gc/delete/1", "DeleteManifest"))
    g.decided(observe(tags={mig.PINNED: mig.GOOD}), at(11))
    g.decided(observe(tags={mig.PINNED: mig.GOOD}), at(9 + 86400))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="GarbageCollectionFailed",
          phase="GarbageCollectionFailed")
    assert s["pod"] == f"{NS}/{mig.name(1)}"


def test_a_rolled_back_migration_failed_and_names_the_pod_on_the_source_node() -> None:
    pending = mig.restored(phase="Pending", node_name=None)
    g = mig.restoring().decided(mig.at_restore(1, pending), at(8))
    g.decided(mig.at_restore(1, pending), at(7 + 300)).decided(mig.at_restore(1, None), at(308))
    back = mig.restored(2, node_name=SRC_NODE, **mig.FRESH)
    g.decided(observe({f"{NS}/{mig.name(2)}": back}, nodes={SRC_NODE: node(SRC_NODE)}),
              at(309))
    g.decided(observe(tags={mig.PINNED: None}), at(310))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="RolledBack", phase="RolledBack")
    assert s["pod"] == f"{NS}/{mig.name(2)}"
    assert SRC_NODE in message(s, "Failed")


def test_a_migration_retargeted_to_its_own_node_ends_cancelled_as_retargeted() -> None:
    g = mig.checkpointed().command("Retarget", at(6), node=SRC_NODE)
    g.decided(observe({mig.SRC: mig.src()}), at(6)).decided(observe({mig.SRC: pod()}), at(7))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="RetargetedToSource", phase="Cancelled")
    assert "pod" not in s  # the source woke in place: nothing was restored


def test_a_migration_cancelled_after_the_source_went_names_the_pod_restored_in_place() -> None:
    """Gate 6: cancel after the delete restores where it was; the pod is reported."""
    pending = mig.restored(phase="Pending", node_name=None)
    g = mig.restoring().decided(mig.at_restore(1, pending), at(8)).command("Cancel", at(9))
    g.decided(mig.at_restore(1, pending), at(9)).decided(mig.at_restore(1, None), at(10))
    g.decided(observe({f"{NS}/{mig.name(2)}": mig.restored(2, node_name=SRC_NODE, **mig.FRESH)},
                      nodes={SRC_NODE: node(SRC_NODE)}), at(11))
    g.decided(observe(tags={mig.PINNED: None}), at(12))
    s = status("Migration", record(g))
    ended(s, succeeded=False, reason="Cancelled", phase="Cancelled")
    assert s["pod"] == f"{NS}/{mig.name(2)}"
    assert f"running on {SRC_NODE}" in message(s, "Failed")


def test_a_suspension_whose_delete_was_refused_fails_with_the_machines_reason() -> None:
    g = sus.captured().decided(observe({sus.SRC: sus.src()}, {sus.PINNED: sus.GOOD}), at(6))
    g.event(action_failed(f"{sus.SID}/source/delete/1", "DeletePod"))
    g.decided(observe({sus.SRC: sus.src()}, {sus.PINNED: sus.GOOD}), at(7))
    g.decided(observe({sus.SRC: pod()}), at(8))
    ended(status("Suspension", record(g)), succeeded=False, reason="ActionFailed",
          phase="Failed")


def test_a_cancelled_suspension_is_cancelled() -> None:
    g = sus.captured().command("Cancel", at(6))
    g.decided(observe({sus.SRC: sus.src()}), at(6)).decided(observe({sus.SRC: pod()}), at(7))
    s = status("Suspension", record(g))
    ended(s, succeeded=False, reason="Cancelled", phase="Cancelled")
    assert message(s, "Failed") == "workload resumed in place"


def test_a_drain_with_a_failed_child_fails_and_counts_it() -> None:
    g = drn.draining(pods=2).decided(drn.seen(True), at(2))
    g.decided(drn.seen(True, {drn.child(0): drn.view(0, "Succeeded", True),
                              drn.child(1): drn.view(1, "RolledBack", True, "RestoreFailed")}),
              at(9))
    g.decided(drn.seen(True), at(10))
    s = status("Drain", record(g))
    ended(s, succeeded=False, reason="ChildrenFailed", phase="Failed")
    assert (s["drain"]["succeeded"], s["drain"]["failed"]) == (1, 1)


def test_a_cancelled_drain_is_cancelled_with_its_skipped_children() -> None:
    g = drn.given(pods=1).decided(drn.seen(True), at(0), until_idle=False)
    g.command("Cancel", at(1)).decided(drn.seen(True), at(1))
    s = status("Drain", record(g))
    ended(s, succeeded=False, reason="Cancelled", phase="Cancelled")
    assert s["drain"]["skipped"] == 1


# -- a Suspension that is resumed ------------------------------------------------------------

def test_a_resuming_suspension_follows_the_resume_and_keeps_its_checkpoint() -> None:
    suspended = recorded()["suspend"]
    g = sus.resume([sus.NEWEST]).decided(observe(tags={sus.PINNED: sus.GOOD}), T0)
    s = status("Suspension", suspended, resume=record(g, settled=False))
    assert s["phase"] == "Restoring"
    assert conditions(s) == {"Accepted": ("True", "OperationCreated"),
                             "Progressing": ("True", "Restoring")}
    assert (s["operationID"], s["resumeOperationID"]) == (suspended.id, sus.RID)
    assert s["checkpoint"] == status("Suspension", suspended)["checkpoint"]
    assert "completionTime" not in s
    assert "pod" not in s


def test_a_resumed_suspension_succeeds_and_names_the_resumed_pod() -> None:
    rows = recorded()
    s = status("Suspension", rows["suspend"], resume=rows["resume"])
    ended(s, succeeded=True, reason="Resumed", phase="Resumed")
    plan = rows["resume"].state["restore"]["plan"]
    assert s["pod"] == f"{plan['namespace']}/{plan['pod_name']}"
    assert s["startTime"] == rfc3339(rows["suspend"].created_at)
    assert s["completionTime"] == rfc3339(rows["resume"].updated_at)


def test_a_resume_that_keeps_failing_fails_the_suspension() -> None:
    nodes = {TARGET: node(TARGET)}
    second = f"{NS}/{restore_pod_name(POD, sus.RID, 2)}"
    g = sus.resume([sus.NEWEST], restore_attempts=2).decided(
        observe(tags={sus.PINNED: sus.GOOD}), T0)
    g.decided(observe({sus.KEY: sus.created(phase="Failed")}, nodes=nodes), at(1))
    g.decided(observe({sus.KEY: None}, nodes=nodes), at(2))
    g.decided(observe({second: sus.created(2, phase="Failed")}, nodes=nodes), at(3))
    g.decided(observe({second: None}, nodes=nodes), at(4))
    s = status("Suspension", recorded()["suspend"], resume=record(g))
    ended(s, succeeded=False, reason="RestoreFailed", phase="Failed")


# -- settled, not merely terminal ------------------------------------------------------------

@pytest.mark.parametrize("unsettled", [{"settled": False}, {"pending": True}],
                         ids=["leased", "actions-pending"])
def test_a_terminal_operation_is_not_succeeded_until_it_settles(
        unsettled: dict[str, bool]) -> None:
    g = ckpt.given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    g.decided(ckpt.obs(tag=ckpt.GOOD), at(5))
    s = status("Checkpoint", record(g, **unsettled))
    assert conditions(s) == {"Accepted": ("True", "OperationCreated"),
                             "Progressing": ("True", "Succeeded")}
    assert "completionTime" not in s


def test_a_running_operation_is_progressing_in_its_phase_saying_what_it_waits_for() -> None:
    g = mig.given().decided(observe({mig.SRC: pod()}, {mig.ART: None}), T0)
    s = status("Migration", record(g, settled=False))
    assert conditions(s)["Progressing"] == ("True", "Checkpointing")
    assert "node agent" in message(s, "Progressing")
    held = status("Migration", record(g, settled=False, held=True))
    assert "admission queue" in message(held, "Progressing")


# -- no operation ----------------------------------------------------------------------------

def test_a_refused_spec_is_not_accepted_with_the_refusals_reason() -> None:
    refusal = Refusal("WorkloadBusy", "apps/web already has a live migration (op-1)")
    s = status("Migration", None, refusal=refusal, generation=2)
    assert s == {"observedGeneration": 2, "phase": "Refused", "conditions": [{
        "type": "Accepted", "status": "False", "reason": "WorkloadBusy",
        "message": refusal.message, "lastTransitionTime": rfc3339(NOW),
        "observedGeneration": 2}]}


def test_a_reason_that_is_not_an_identifier_is_cut_down_to_one() -> None:
    s = status("Checkpoint", None, refusal=Refusal("403 invalid spec!", "no"))
    assert conditions(s)["Accepted"] == ("False", "invalidspec")
    assert conditions(status("Checkpoint", None, refusal=Refusal("-", "?")))["Accepted"] == \
        ("False", "Unknown")


def test_before_its_operation_exists_a_resource_is_pending() -> None:
    s = status("Drain", None)
    assert s["phase"] == "Pending"
    assert conditions(s) == {"Accepted": ("Unknown", "Pending")}


def test_an_operation_of_another_kind_or_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpoint machine, not migration"):
        status("Checkpoint", recorded()["migration"])
    with pytest.raises(ValueError, match="no resume"):
        status("Migration", recorded()["migration"], resume=recorded()["resume"])
    with pytest.raises(ValueError, match="known: Checkpoint"):
        status("CheckpointClass", None)


# -- transition times --------------------------------------------------------------------------

def test_transition_times_are_kept_while_nothing_changes() -> None:
    op = recorded()["checkpoint"]
    first = status("Checkpoint", op, now=NOW)
    again = status("Checkpoint", op, previous=first, now=LATER)
    assert again == first
    assert not needs_write(first, again)


def test_a_condition_that_flips_moves_its_time_and_the_others_keep_theirs() -> None:
    g = ckpt.given(quiesce=True).decided(observe({f"{NS}/{POD}": pod()}), T0)
    g.decided(ckpt.obs(tag=ckpt.GOOD), at(5))
    running = status("Checkpoint", record(g, settled=False), now=NOW)
    done = status("Checkpoint", record(g), previous=running, now=LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times == {"Accepted": rfc3339(NOW), "Progressing": rfc3339(LATER),
                     "Succeeded": rfc3339(LATER), "Failed": rfc3339(LATER)}
    assert needs_write(running, done)


def test_times_are_utc_whole_seconds_with_z() -> None:
    assert rfc3339(NOW) == "2026-12-01T09:30:15Z"
    paris = datetime(2026, 12, 1, 10, 30, 15, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    assert rfc3339(paris) == "2026-12-01T10:30:15Z"
    assert rfc3339(datetime(2026, 12, 1, 9, 30, 15)) == "2026-12-01T09:30:15Z"  # naive: UTC


# -- when to write ----------------------------------------------------------------------------

def test_a_lost_status_is_written() -> None:
    desired = status("Checkpoint", recorded()["checkpoint"])
    assert needs_write(None, desired)
    assert needs_write({}, desired)
    assert status_patch(None, desired) == desired


def test_an_edited_phase_or_a_stale_generation_is_written_back() -> None:
    desired = status("Checkpoint", recorded()["checkpoint"], generation=3)
    assert status_patch({**desired, "phase": "Failed"}, desired) == {"phase": "Succeeded"}
    stale = status("Checkpoint", recorded()["checkpoint"], generation=2)
    patch = status_patch(stale, desired)
    assert patch["observedGeneration"] == 3
    assert patch["conditions"] == desired["conditions"]  # a list is replaced whole


def test_keys_the_mirror_does_not_own_are_left_alone() -> None:
    desired = status("Checkpoint", recorded()["checkpoint"])
    assert not needs_write({**desired, "someoneElses": {"x": 1}}, desired)


def test_a_key_that_no_longer_applies_is_removed_by_the_patch() -> None:
    """Resuming a suspension takes its completionTime away; a merge patch needs a null
    for that, and a nested key that went is nulled inside its object."""
    suspended = recorded()["suspend"]
    before = status("Suspension", suspended)
    g = sus.resume([sus.NEWEST]).decided(observe(tags={sus.PINNED: sus.GOOD}), T0)
    after = status("Suspension", suspended, resume=record(g, settled=False), previous=before)
    patch = status_patch(before, after)
    assert patch["completionTime"] is None
    assert patch["resumeOperationID"] == sus.RID
    assert not {"checkpoint", "startTime", "operationID"} & patch.keys()
    edited = {**after, "checkpoint": {**after["checkpoint"], "digest": "sha256:00"}}
    assert status_patch(edited, after) == {"checkpoint": {"digest": after["checkpoint"]
                                                          ["digest"]}}
    assert status_patch({**after, "checkpoint": {**after["checkpoint"], "extra": "x"}},
                        after) == {"checkpoint": {"extra": None}}
