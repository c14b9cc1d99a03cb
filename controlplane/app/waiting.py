"""What an operation waits for now, in one sentence, from its projection alone: the
CLI's ``--wait`` line (:mod:`controlplane.cli.progress`) and the API's ``waiting_for``
(the dashboard's "waiting in PHASE for ...") say the same."""

from __future__ import annotations

from controlplane.store.records import MachineRecord

#: What a machine in each non-terminal phase is waiting for (every product kind's phases).
WAITING_FOR = {
    "Pending": "a worker to start it",
    "Running": "its next step",
    "Requested": "the node agent to capture and push the checkpoint",
    "Checkpointing": "the node agent to capture and push the checkpoint, and the "
                     "registry to show it",
    "Captured": "the registry to show the pushed checkpoint",
    "Verified": "the workload to be released after the capture",
    "DeletingSource": "the source pod to be gone",
    "Restoring": "the restored pod to be scheduled, restored by the node agent and Ready",
    "Adopting": "the ReplicaSet to adopt the restored pod, and the source to be gone",
    "RollingBack": "the workload to be restored on its source node",
    "CollectingGarbage": "the checkpoint artifact to be deleted from the registry",
    "WakingInPlace": "the source pod to resume where it is",
    "Unsticking": "the source pod to resume after a failed capture",
    "Resolving": "the registry to resolve the checkpoint",
    "Selecting": "a checkpoint to resume from",
    "ColdBooting": "the pod to start from its spec (no usable checkpoint)",
    "CleaningUp": "a failed restore's pod to be removed",
    "Cordoning": "the node to be cordoned",
    "Draining": "the drain's child migrations",
    "Uncordoning": "the node to be uncordoned",
    "Waiting": "its next check",
    "Started": "its first step",
}


def waiting_for(record: MachineRecord) -> str:
    """One line saying what ``record`` waits for now."""
    if record.held:
        return "its turn in the admission queue (a concurrency limit is full)"
    if record.terminal:
        return ("its last actions to be performed" if record.pending_actions
                else "its worker to let go of it")
    if record.pending_actions:
        kinds = sorted({str(a.get("type", "action")) for a in record.pending_actions})
        return "a worker to perform " + ", ".join(kinds)
    return WAITING_FOR.get(record.phase, "its next observation")


def settled(record: MachineRecord) -> bool:
    """Terminal, its actions performed and its lease released: nothing more will happen."""
    return record.terminal and record.lease_owner is None and record.next_wake_at is None
