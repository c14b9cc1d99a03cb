"""Follow a machine until it settles, showing its phase, elapsed time and what it waits
for (``--wait``).

On a terminal one line is redrawn; in a log, one line per change. Returns the settled
record; the caller turns its phase into an exit code.
"""

from __future__ import annotations

import asyncio
import sys
import time

from controlplane.errors import ControlPlaneError
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.records import MachineRecord

#: Phases that mean the operation did what was asked.
SUCCESS_PHASES = frozenset({"Succeeded", "Suspended", "Resumed"})


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


class WaitTimedOut(ControlPlaneError):
    """The machine did not settle within the wait limit (it keeps running)."""


def settled(record: MachineRecord) -> bool:
    return record.terminal and record.lease_owner is None and record.next_wake_at is None


async def follow(db: Database, machine_id: str, label: str, *, limit_seconds: float = 600,
                 prefix: str = "") -> MachineRecord:
    t0 = time.monotonic()
    live = sys.stdout.isatty()
    shown = ""
    while True:
        record = await queries.get_machine(db, machine_id)
        elapsed = time.monotonic() - t0
        status = record.phase if settled(record) else \
            f"{record.phase}, waiting for {waiting_for(record)}"
        if live:
            sys.stdout.write(f"\r\x1b[K{prefix}{label}: {elapsed:5.1f}s {status}")
        elif status != shown:
            sys.stdout.write(f"{prefix}{label}: {status} at {elapsed:.1f}s\n")
        shown = status
        sys.stdout.flush()
        if settled(record):
            sys.stdout.write("\n" if live else "")
            return record
        if elapsed > limit_seconds:
            sys.stdout.write("\n" if live else "")
            raise WaitTimedOut(
                f"{label} is still {record.phase} after {limit_seconds:.0f}s, waiting for "
                f"{waiting_for(record)}",
                hint=f"it keeps running; follow it with `cpctl history {machine_id}`")
        await asyncio.sleep(0.1)
