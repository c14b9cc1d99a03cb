"""Follow a machine until it settles, showing its phase and elapsed time (``--wait``).

On a terminal one line is redrawn; in a log, one line per phase change. Returns the
settled record; the caller turns its phase into an exit code.
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
        if live:
            sys.stdout.write(f"\r{prefix}{label}: {record.phase:<18} {elapsed:5.1f}s ")
        elif record.phase != shown:
            sys.stdout.write(f"{prefix}{label}: {record.phase} at {elapsed:.1f}s\n")
        shown = record.phase
        sys.stdout.flush()
        if settled(record):
            sys.stdout.write("\n" if live else "")
            return record
        if elapsed > limit_seconds:
            sys.stdout.write("\n" if live else "")
            raise WaitTimedOut(
                f"{label} is still {record.phase} after {limit_seconds:.0f}s",
                hint=f"it keeps running; follow it with `cpctl history {machine_id}`")
        await asyncio.sleep(0.1)
