"""What an operation waits for (``--wait``, and the API's ``waiting_for``), from its
projection alone.

The sentences are pinned here, written out per phase of each kind, not read from the
implementation's table: a test that took them from there would pass whatever they said.
Every non-terminal phase of every registered kind must have one (found by walking the
kinds, so a new phase or kind without a sentence fails here by name)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum

import pytest

from controlplane.app.waiting import waiting_for
from controlplane.machines.catalog import default_kinds
from controlplane.store.records import MachineRecord

T0 = datetime(2026, 11, 22, tzinfo=UTC)
RECORD = MachineRecord(id="m", kind="migration", phase="Restoring", version=7, spec={},
                       state={}, terminal=False, pending_actions=[], next_wake_at=None,
                       wake_seq=0, lease_owner=None, lease_expires_at=None, attempts=0,
                       created_at=T0, updated_at=T0)
UNKNOWN = "its next observation"  # what a phase without a sentence gets

CAPTURE = "the node agent to capture and push the checkpoint"
CHECKPOINTING = ("the node agent to capture and push the checkpoint, and the registry to "
                 "show it")
UNSTICKING = "the source pod to resume after a failed capture"
WAKING_IN_PLACE = "the source pod to resume where it is"
DELETING_SOURCE = "the source pod to be gone"
RESTORING = "the restored pod to be scheduled, restored by the node agent and Ready"

#: kind -> non-terminal phase -> what a machine of that kind in that phase waits for.
SENTENCES: dict[str, dict[str, str]] = {
    "checkpoint": {
        "Requested": CAPTURE,
        "Captured": "the registry to show the pushed checkpoint",
        "Verified": "the workload to be released after the capture",
        "Unsticking": UNSTICKING,
    },
    "restore": {
        "Resolving": "the registry to resolve the checkpoint",
        "Restoring": RESTORING,
        "CleaningUp": "a failed restore's pod to be removed",
    },
    "migration": {
        "Checkpointing": CHECKPOINTING,
        # A streamed migration restores beside its frozen source: the sentences say so.
        "Unsticking": UNSTICKING + ", after any restore pod is removed",
        "WakingInPlace": WAKING_IN_PLACE + ", after any restore pod beside it is removed",
        "DeletingSource": DELETING_SOURCE + " (streamed: the restored pod already runs "
                                            "verified; lazy: every page arrived)",
        "TargetRunning": "every page of the source's memory to reach the restored pod, "
                         "which already runs (lazy)",
        "ClearingLostWorkload": "the restored pod and what is left of the source to be "
                                "removed: the workload was lost (lazy)",
        "Restoring": RESTORING + " (streamed: restored from the source's agent and proven "
                                 "equal to the registry's checkpoint, the source kept frozen)",
        "Adopting": "the ReplicaSet to adopt the restored pod, and the source to be gone",
        "RollingBack": "the workload to be restored on its source node",
        "CollectingGarbage": "the checkpoint artifact to be deleted from the registry",
    },
    "suspend": {
        "Checkpointing": CHECKPOINTING,
        "DeletingSource": DELETING_SOURCE,
        "Unsticking": UNSTICKING,
        "WakingInPlace": WAKING_IN_PLACE,
    },
    "resume": {
        "Selecting": "a checkpoint to resume from",
        "Restoring": RESTORING,
        "ColdBooting": "the pod to start from its spec (no usable checkpoint)",
    },
    "drain": {
        "Cordoning": "the node to be cordoned",
        "Draining": "the drain's child migrations",
        "Uncordoning": "the node to be uncordoned",
    },
    "steps": {
        "Waiting": "its next check",
        "Running": "its next step",
    },
}


def phases_of_every_kind() -> dict[str, tuple[list[str], list[str]]]:
    """kind -> (its non-terminal phases, its terminal ones), from the registered kinds: a
    decider's ``initial_state`` names its state class, whose ``TERMINAL_PHASES`` are
    members of the kind's phase enum."""
    kinds = default_kinds()
    found = {}
    for kind in kinds:
        state = inspect.signature(kinds.get(kind).initial_state, eval_str=True).return_annotation
        terminal = state.TERMINAL_PHASES
        phase_enum = type(next(iter(terminal)))
        assert issubclass(phase_enum, StrEnum), (kind, phase_enum)
        found[kind] = ([p.value for p in phase_enum if p not in terminal],
                       [p.value for p in phase_enum if p in terminal])
    return found


def in_phase(kind: str, phase: str) -> MachineRecord:
    return replace(RECORD, kind=kind, phase=phase)


@pytest.mark.parametrize(("kind", "phase", "sentence"), [
    (kind, phase, sentence) for kind, phases in SENTENCES.items()
    for phase, sentence in phases.items()])
def test_each_phase_of_each_kind_says_what_it_waits_for(kind: str, phase: str,
                                                       sentence: str) -> None:
    assert waiting_for(in_phase(kind, phase)) == sentence


def test_every_non_terminal_phase_of_every_kind_has_a_sentence() -> None:
    """A phase without one would show "waiting for its next observation": say which."""
    missing = [f"{kind} {phase}" for kind, (running, _) in phases_of_every_kind().items()
               for phase in running if waiting_for(in_phase(kind, phase)) == UNKNOWN]
    assert not missing, f"phases with no sentence in controlplane.app.waiting: {missing}"


def test_every_non_terminal_phase_of_every_kind_is_pinned_here() -> None:
    """A new kind or phase gets its sentence written out above, or this fails naming it."""
    running = {kind: phases for kind, (phases, _) in phases_of_every_kind().items()}
    unpinned = [f"{kind} {phase}" for kind, phases in running.items() for phase in phases
                if phase not in SENTENCES.get(kind, {})]
    assert not unpinned, f"add the expected sentence to SENTENCES for: {unpinned}"
    stale = [f"{kind} {phase}" for kind, phases in SENTENCES.items() for phase in phases
             if phase not in running.get(kind, [])]
    assert not stale, f"no such non-terminal phase (renamed, or terminal now?): {stale}"


def test_a_held_operation_waits_for_its_turn_in_the_admission_queue() -> None:
    assert "admission queue" in waiting_for(replace(RECORD, held=True))


def test_committed_actions_not_yet_performed_are_named() -> None:
    record = replace(RECORD, pending_actions=[{"type": "DeletePod", "key": "k", "params": {}},
                                              {"type": "EmitEvent", "key": "e", "params": {}}])
    assert waiting_for(record) == "a worker to perform DeletePod, EmitEvent"


def test_a_terminal_operation_waits_only_for_its_last_actions_or_its_lease() -> None:
    done = replace(RECORD, phase="Succeeded", terminal=True)
    assert waiting_for(done) == "its worker to let go of it"
    assert waiting_for(replace(done, pending_actions=[{"type": "EmitEvent"}])) == \
        "its last actions to be performed"


def test_an_unknown_phase_still_gets_a_sentence() -> None:
    assert waiting_for(replace(RECORD, phase="SomethingNew")) == UNKNOWN
