"""Prometheus text exposition (format 0.0.4) of the control plane, written by hand.

Called by ``GET /metrics`` in :mod:`controlplane.api.app`. Every value is read from the
database at scrape time (machines projection, ``report_operations`` view, events log),
so any number of API replicas report the same numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict

from controlplane.store import queries, reports
from controlplane.store.database import Database

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Operation durations span seconds (checkpoints) to tens of minutes (stuck migrations).
BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
GC_FAILED = "ArtifactDeletionFailed"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Exposition:
    """Accumulates metric families; ``text()`` renders them."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        self._lines.append(f"{name}{_labels(**labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def histogram(out: Exposition, name: str, label: str,
              values: dict[str, list[float]]) -> None:
    """Cumulative ``_bucket``/``_sum``/``_count`` samples per label value."""
    for key in sorted(values):
        observed = values[key]
        for bound in (*BUCKETS, math.inf):
            le = "+Inf" if math.isinf(bound) else _number(bound)
            out.sample(f"{name}_bucket", sum(1 for v in observed if v <= bound),
                       **{label: key, "le": le})
        out.sample(f"{name}_sum", sum(observed), **{label: key})
        out.sample(f"{name}_count", len(observed), **{label: key})


async def render(db: Database) -> str:
    out = Exposition()
    out.family("controlplane_operations", "gauge",
               "Operations (machines) by kind and current phase.")
    for (kind, phase), count in sorted((await queries.count_by_phase(db)).items()):
        out.sample("controlplane_operations", count, kind=kind, phase=phase)

    durations: dict[str, list[float]] = defaultdict(list)
    for row in await reports.rows(
            db, "SELECT kind, terminal, duration_seconds FROM report_operations"):
        if row["terminal"] and row["duration_seconds"] is not None:
            durations[str(row["kind"])].append(float(row["duration_seconds"]))
    out.family("controlplane_operation_duration_seconds", "histogram",
               "Submission to finish of finished operations, by kind.")
    histogram(out, "controlplane_operation_duration_seconds", "kind", durations)

    counts = (await reports.rows(
        db, "SELECT count(*) AS events, "
            "sum(CASE WHEN type = :gc THEN 1 ELSE 0 END) AS gc_failures FROM events",
        {"gc": GC_FAILED}))[0]
    out.family("controlplane_gc_failures_total", "counter",
               f"Artifact deletions that failed ({GC_FAILED} events).")
    out.sample("controlplane_gc_failures_total", int(counts["gc_failures"] or 0))
    out.family("controlplane_events_total", "counter", "Events appended to the event log.")
    out.sample("controlplane_events_total", int(counts["events"] or 0))
    return out.text()
