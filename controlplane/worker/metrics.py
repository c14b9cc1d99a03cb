"""A worker process's own counters, for its ``/metrics`` (``cpctl worker --metrics-listen``).

What only the process knows and the database never records: leases it lost to another
worker (its writes were fenced off), optimistic-version conflicts, steps that crashed,
commits it made, and the actions that failed for good, by action and error class. The
cluster-wide figures (operations by phase, queue depth, durations) are computed from the
database by the API's ``/metrics`` (:mod:`controlplane.api.metrics`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from controlplane.exposition import Exposition


@dataclass
class WorkerMetrics:
    """Monotonic counters, updated by :class:`~controlplane.worker.loop.Worker`."""

    transitions: Counter[str] = field(default_factory=Counter)  # kind -> events committed
    lease_losses: int = 0
    conflicts: int = 0
    step_crashes: int = 0
    claims: int = 0
    confirmations: int = 0  # decisions that would end a machine, read through first
    overturned: int = 0  # ... whose fresh read differed from the cache's
    action_failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Machines left to a newer worker (``worker.readable``), by reason; and how many now.
    machines_left: Counter[str] = field(default_factory=Counter)
    machines_left_now: int = 0
    started: float = field(default_factory=time.monotonic)
    last_loop: float = field(default_factory=time.monotonic)  # the claim loop's last turn

    def loop_age(self) -> float:
        """Seconds since the claim loop last turned (liveness)."""
        return time.monotonic() - self.last_loop

    def render(self, worker_id: str, in_flight: int) -> str:
        out = Exposition()
        w = {"worker": worker_id}
        out.family("controlplane_worker_transitions_total", "counter",
                   "Events this worker committed, by machine kind.")
        for kind, n in sorted(self.transitions.items()):
            out.sample("controlplane_worker_transitions_total", n, kind=kind, **w)
        for name, value, text in [
            ("controlplane_worker_lease_losses_total", self.lease_losses,
             "Steps whose commit was fenced off: another worker took the lease over."),
            ("controlplane_worker_conflicts_total", self.conflicts,
             "Steps whose commit lost the optimistic version check."),
            ("controlplane_worker_step_crashes_total", self.step_crashes,
             "Steps that raised (a bug in a decider, observer or handler); retried later."),
            ("controlplane_worker_claims_total", self.claims, "Machines claimed."),
            ("controlplane_worker_confirmations_total", self.confirmations,
             "Decisions that would end a machine, confirmed by reading its pods through."),
            ("controlplane_worker_overturned_total", self.overturned,
             "Confirmations where the server's pods differed from the watch cache's."),
        ]:
            out.family(name, "counter", text)
            out.sample(name, value, **w)
        out.family("controlplane_worker_action_failures_total", "counter",
                   "Actions that failed for good, by action and error class.")
        for (action, error_class), n in sorted(self.action_failures.items()):
            out.sample("controlplane_worker_action_failures_total", n, action=action,
                       error_class=error_class, **w)
        out.family("controlplane_worker_machines_left_total", "counter",
                   "Machines this worker could not read (a newer release's kind, state field "
                   "or value, or outbox action) and left to a newer worker, by reason.")
        for reason, n in sorted(self.machines_left.items()):
            out.sample("controlplane_worker_machines_left_total", n, reason=reason, **w)
        out.family("controlplane_worker_machines_left", "gauge",
                   "Machines this worker leaves to a newer worker and no longer claims.")
        out.sample("controlplane_worker_machines_left", self.machines_left_now, **w)
        out.family("controlplane_worker_in_flight", "gauge", "Machines being driven now.")
        out.sample("controlplane_worker_in_flight", in_flight, **w)
        out.family("controlplane_worker_uptime_seconds", "gauge", "Seconds since start.")
        out.sample("controlplane_worker_uptime_seconds",
                   round(time.monotonic() - self.started, 3), **w)
        return out.text()
