"""Follow a machine until it settles, showing its phase, elapsed time and what it waits
for (``--wait``).

On a terminal one line is redrawn; in a log, one line per change. Returns the settled
record; the caller turns its phase into an exit code.
"""

from __future__ import annotations

import asyncio
import sys
import time

from controlplane.app.waiting import settled, succeeded, waiting_for
from controlplane.cli.render import terminal_width
from controlplane.cli.why import fit
from controlplane.errors import ControlPlaneError
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.records import MachineRecord

__all__ = ["WaitTimedOut", "follow", "succeeded"]


class WaitTimedOut(ControlPlaneError):
    """The machine did not settle within the wait limit (it keeps running)."""


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
        if live:  # one line, cut to the terminal: a wrapped one would stack at each redraw
            # the last column stays free: a line that fills it wraps on some terminals
            line = fit(f"{prefix}{label}: {elapsed:5.1f}s {status}",
                       (terminal_width(sys.stdout) or 80) - 1)
            sys.stdout.write(f"\r\x1b[K{line}")
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
