"""The admitter: lets held operations in, oldest first, when their limits allow.

Runs inside every worker's loop (cheap when nothing is held); the store serialises it
under the admission lock, so several workers never over-admit. The rules are
``controlplane.machines.submission.admission``; this module only applies them in FIFO
order, counting each admitted operation before judging the next.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.machines.submission import (
    ActiveOperation,
    Admit,
    Limits,
    OperationRequest,
    admission,
)
from controlplane.store import admission as admission_store
from controlplane.store.admission import LiveOperation
from controlplane.store.database import Database


def choose_admissions(live: list[LiveOperation], limits: Limits) -> list[tuple[LiveOperation,
                                                                                str]]:
    """Pure: which held operations to let in now, in FIFO order, and why."""
    running = [ActiveOperation(op.machine_id, op.kind, op.workload, op.source_node)
               for op in live if not op.held]
    chosen = []
    for op in (o for o in live if o.held):
        verdict = admission(OperationRequest(op.kind, op.workload, op.source_node), running,
                            limits)
        if isinstance(verdict, Admit):
            chosen.append((op, f"within limits ({len(running) + 1} of {limits.max_cluster} "
                               "running)"))
            running.append(ActiveOperation(op.machine_id, op.kind, op.workload,
                                           op.source_node))
    return chosen


async def admit_held(db: Database, limits: Limits, *, now: datetime) -> list[str]:
    """Admit what fits; return the ids let in (nothing to do costs one indexed read)."""
    if not await admission_store.any_held(db):
        return []
    return await admission_store.admit_held(
        db, lambda live: choose_admissions(live, limits), now=now)
