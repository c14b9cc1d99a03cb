"""Prometheus text exposition (format 0.0.4) of the control plane, written by hand.

Called by ``GET /metrics`` in :mod:`controlplane.api.app`. Every value is read from the
database at scrape time (machines projection, the reporting views, events log), so any
number of API replicas report the same numbers. A worker's own process counters (lease
losses, retries, transitions it made) are on that worker's ``/metrics``
(:mod:`controlplane.worker.metrics`), a node agent's on its own
(:mod:`drivers.agent.metrics`). The alert rules and the Grafana dashboard built on these
series are in ``deploy/monitoring/`` (``docs/alerts.md``).

Figures read from the reporting views (durations, failures, checkpoint bytes) cover all
time, a prune included; those read from ``events`` itself (``controlplane_events_total``,
``controlplane_transitions_total``, ``controlplane_gc_failures_total``) shrink when
retention prunes (``docs/retention.md``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from controlplane.exposition import CONTENT_TYPE, Exposition, histogram
from controlplane.machines.catalog import kinds
from controlplane.machines.stages.collect import ArtifactDeletionFailed
from controlplane.store import queries, reports
from controlplane.store.database import Database
from controlplane.store.records import MachineRecord

__all__ = ["CONTENT_TYPE", "render"]
GC_FAILED = ArtifactDeletionFailed.NAME
#: The live operations read per scrape for the per-node and overdue figures, oldest
#: first: far above what a cluster runs at once (a drain holds its queued children).
LIVE_READ = 10_000


async def render(db: Database, now: datetime) -> str:
    out = Exposition()
    out.family("controlplane_operations", "gauge",
               "Operations (machines) by kind and current phase.")
    for (kind, phase), count in sorted((await queries.count_by_phase(db)).items()):
        out.sample("controlplane_operations", count, kind=kind, phase=phase)

    durations: dict[str, list[float]] = defaultdict(list)
    for kind, seconds in await reports.finished_durations(db):
        durations[kind].append(seconds)
    out.family("controlplane_operation_duration_seconds", "histogram",
               "Submission to finish of finished operations, by kind.")
    histogram(out, "controlplane_operation_duration_seconds", "kind", durations)

    events, gc_failures = await reports.event_counts(db, of_type=GC_FAILED)
    out.family("controlplane_gc_failures_total", "counter",
               f"Artifact deletions that failed ({GC_FAILED} events).")
    out.sample("controlplane_gc_failures_total", gc_failures)
    out.family("controlplane_events_total", "counter", "Events appended to the event log.")
    out.sample("controlplane_events_total", events)

    out.family("controlplane_transitions_total", "counter",
               "Events recorded, by machine kind (rate() of it is transitions per second).")
    for kind, count in sorted((await queries.events_by_kind(db)).items()):
        out.sample("controlplane_transitions_total", count, kind=kind)

    depth = await queries.queue_depth(db, now)
    out.family("controlplane_queue_depth", "gauge",
               "Operations waiting: 'admission' = held by a concurrency limit; 'due' = due "
               "now and not claimed by any worker; 'leased' = being driven.")
    for state in ("admission", "due", "leased"):
        out.sample("controlplane_queue_depth", depth[state], state=state)

    out.family("controlplane_action_failures_total", "counter",
               "Actions that failed for good (ActionFailed events), by action and error "
               "class.")
    for (action, error_class), count in sorted((await queries.action_failures(db)).items()):
        out.sample("controlplane_action_failures_total", count, action=action,
                   error_class=error_class)

    phases: dict[str, list[float]] = defaultdict(list)
    for row in await reports.migration_phases(db, finished_only=True):
        for column in reports.MIGRATION_PHASES:
            if row[column] is not None:
                phases[column.removesuffix("_seconds")].append(float(row[column]))
    out.family("controlplane_migration_phase_duration_seconds", "histogram",
               "Time finished migrations spent in each phase (queued, checkpoint, delete, "
               "restore, gc; see report_migrations).")
    histogram(out, "controlplane_migration_phase_duration_seconds", "phase", phases)

    live = await queries.list_machines(db, queries.MachineFilter(
        terminal=False, limit=LIVE_READ, order="created_at"))
    out.family("controlplane_operation_wake_overdue_seconds", "gauge",
               "The longest any live operation of this kind has been past its scheduled "
               "wake (every waiting phase wakes at or before its deadline, where its hang "
               "guard fires): above a few poll intervals, nobody is deciding it.")
    for kind, seconds in sorted(wake_overdue(live, now).items()):
        out.sample("controlplane_operation_wake_overdue_seconds", seconds, kind=kind)
    out.family("controlplane_node_operations", "gauge",
               "Live operations moving load off a node or putting a workload on it (as "
               "`cpctl list --node NODE` selects them): work that needs the node's agent.")
    for node, count in sorted(node_operations(live).items()):
        out.sample("controlplane_node_operations", count, node=node)

    out.family("controlplane_operations_failed_total", "counter",
               "Operations that ended without success, by kind and finish reason (the "
               "reporting views: pruned operations still count).")
    for row in sorted(await reports.failures_by_reason(db),
                      key=lambda r: (str(r["kind"]), str(r["reason"]))):
        out.sample("controlplane_operations_failed_total", int(row["operations"]),
                   kind=str(row["kind"]), reason=str(row["reason"] or "unknown"))
    out.family("controlplane_checkpoint_bytes_total", "counter",
               "Bytes of verified checkpoints (their archives' declared size), by "
               "checkpoint class.")
    for row in sorted(await reports.bytes_by_class(db), key=lambda r: str(r["class_name"])):
        out.sample("controlplane_checkpoint_bytes_total", int(row["bytes"] or 0),
                   **{"class": str(row["class_name"])})
    out.family("controlplane_history_events", "gauge",
               "Events in the history's log now: grows with every transition, falls when "
               "retention prunes settled operations to summaries.")
    out.sample("controlplane_history_events", events)
    return out.text()


def wake_overdue(live: list[MachineRecord], now: datetime) -> dict[str, float]:
    """Per kind, the most seconds a live operation not held by admission has been past
    its ``next_wake_at``; 0 for every known kind with none. Pure."""
    overdue = dict.fromkeys(kinds(), 0.0)
    for record in live:
        if record.held or record.next_wake_at is None or record.next_wake_at > now:
            continue
        late = round((now - record.next_wake_at).total_seconds(), 3)
        overdue[record.kind] = max(overdue.get(record.kind, 0.0), late)
    return overdue


def node_operations(live: list[MachineRecord]) -> dict[str, int]:
    """Live operations per node they move load off or put a workload on. Pure."""
    count: dict[str, int] = defaultdict(int)
    for record in live:
        nodes = {record.source_node} | {record.spec.get(f) for f in queries.TARGET_FIELDS}
        for node in nodes:
            if isinstance(node, str) and node:
                count[node] += 1
    return dict(count)
