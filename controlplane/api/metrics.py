"""Prometheus text exposition (format 0.0.4) of the control plane, written by hand.

Called by ``GET /metrics`` in :mod:`controlplane.api.app`. Every value is read from the
database at scrape time (machines projection, the reporting views, events log), so any
number of API replicas report the same numbers. A worker's own process counters (lease
losses, retries, transitions it made) are on that worker's ``/metrics``
(:mod:`controlplane.worker.metrics`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from controlplane.exposition import CONTENT_TYPE, Exposition, histogram
from controlplane.machines.stages.collect import ArtifactDeletionFailed
from controlplane.store import queries, reports
from controlplane.store.database import Database

__all__ = ["CONTENT_TYPE", "render"]
GC_FAILED = ArtifactDeletionFailed.NAME


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
    return out.text()
