"""What ``cpctl worker`` says while it runs: a status line at a steady low rate, and a
last line when it stops.

A line every ``--status-seconds`` (default 60) while there was work: operations claimed,
events committed, lease losses and in flight; one ``idle`` line when work stops (not one
a minute), and ``worker W stopped after …`` with the totals as it exits. The text is made
by the pure :func:`status_line` / :func:`stopped_line` from two snapshots of the
worker's counters; :func:`report_status` is the loop. Used by :mod:`controlplane.cli.worker`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.worker.loop import Worker

DEFAULT_SECONDS = 60.0


@dataclass(frozen=True)
class Snapshot:
    """The worker's counters at one moment."""

    claims: int
    events: int
    lease_losses: int
    failures: int
    in_flight: int

    @staticmethod
    def of(worker: Worker) -> Snapshot:
        m = worker.metrics
        return Snapshot(m.claims, sum(m.transitions.values()), m.lease_losses,
                        sum(m.action_failures.values()), worker.in_flight)


def _count(n: int, what: str, plural: str = "") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {plural or what + 's'}"


def status_line(worker_id: str, before: Snapshot, now: Snapshot, seconds: float) -> str | None:
    """The line for one interval; ``None`` when nothing happened and nothing is in flight
    (the caller says ``idle`` once instead)."""
    claims, events = now.claims - before.claims, now.events - before.events
    if claims == events == 0 and now.in_flight == 0:
        return None
    parts = [f"{_count(claims, 'claim')}, {_count(events, 'event')} committed in the last "
             f"{seconds:.0f}s", f"{now.in_flight} in flight"]
    if now.lease_losses > before.lease_losses:
        lost = _count(now.lease_losses - before.lease_losses, "lease loss", "lease losses")
        parts.append(f"{lost} (another worker took them over)")
    if now.failures > before.failures:
        parts.append(_count(now.failures - before.failures, "action failure") + " (cpctl "
                     "history ID says which)")
    return f"worker {worker_id}: " + "; ".join(parts)


def stopped_line(worker_id: str, total: Snapshot, seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    ran = f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    return (f"worker {worker_id} stopped after {ran}: {_count(total.claims, 'claim')}, "
            f"{_count(total.events, 'event')} committed, "
            f"{_count(total.lease_losses, 'lease loss', 'lease losses')}, "
            f"{_count(total.failures, 'action failure')}")


async def report_status(worker: Worker, every: float) -> None:
    """Print :func:`status_line` every ``every`` seconds until cancelled."""
    before, idle = Snapshot.of(worker), False
    while True:
        await asyncio.sleep(every)  # the status interval itself: a rate, not a wait
        now = Snapshot.of(worker)
        line = status_line(worker.config.worker_id, before, now, every)
        if line is not None:
            print(line, flush=True)
            idle = False
        elif not idle:
            print(f"worker {worker.config.worker_id}: idle (nothing due)", flush=True)
            idle = True
        before = now


