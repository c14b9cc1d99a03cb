"""The summary page's pictures: the reporting views (``docs/reporting.md``) as bar charts.

:func:`load` reads the views through :mod:`controlplane.store.reports` (the store's
queries, alike on SQLite and PostgreSQL) and hands the rows to a pure builder per
chart (``operations_per_hour`` ...), which the tests call directly. Hours and
percentiles are computed here in Python, so both backends give the same figures.
Called by :mod:`controlplane.api.summary`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.api.charts import BarChart, Series, seconds, size
from controlplane.store import reports
from controlplane.store.database import Database

Row = Mapping[str, Any]
#: Outcomes as the charts show them, each with its own colour (and the legend's word).
OK, FAILED, RUNNING = "succeeded", "failed", "running"
_OUTCOME_COLOURS = {OK: "#009E73", FAILED: "#D55E00", RUNNING: "#0072B2"}
_PHASES = tuple(p.removesuffix("_seconds") for p in reports.MIGRATION_PHASES)


def percentile(values: Sequence[float], q: float) -> float:
    """``cpctl report``'s percentile (:func:`reports.percentile`) of a non-empty group."""
    found = reports.percentile(values, q)
    assert found is not None, "a chart's group has at least one sample"
    return found


def hour_of(stamp: datetime | str) -> str:
    """``YYYY-MM-DD HH:00`` in UTC, from a driver's datetime or SQLite's UTC text."""
    if isinstance(stamp, datetime):
        stamp = stamp.astimezone(UTC).strftime("%Y-%m-%d %H")
    return f"{str(stamp)[:13].replace('T', ' ')}:00"


def _outcome(row: Row) -> str:
    if not row["terminal"]:
        return RUNNING
    return OK if row["outcome"] in reports.SUCCESS else FAILED


def _outcome_series(groups: Sequence[str], counted: Mapping[tuple[str, str], int]
                    ) -> tuple[Series, ...]:
    return tuple(Series(o, tuple(float(counted.get((g, o), 0)) for g in groups),
                        _OUTCOME_COLOURS[o]) for o in (OK, FAILED, RUNNING))


#: How far back the hourly chart looks.
HOURS = 24


def operations_per_hour(rows: Iterable[Row], now: datetime) -> BarChart:
    """``report_operations`` rows (``submitted_at``, ``outcome``, ``terminal``) of the
    last :data:`HOURS` hours before ``now``: one row per hour from the first with an
    operation to ``now``'s, quiet hours included (the axis is time, not only events)."""
    window = [hour_of(now - timedelta(hours=h)) for h in range(HOURS - 1, -1, -1)]
    counted: dict[tuple[str, str], int] = defaultdict(int)
    for row in rows:
        hour = hour_of(row["submitted_at"])
        if window[0] <= hour <= window[-1]:
            counted[hour, _outcome(row)] += 1
    seen = {h for h, _ in counted}
    hours = tuple(window[min((window.index(h) for h in seen), default=HOURS):])
    return BarChart("operations-per-hour", f"Operations per hour, by outcome (last {HOURS} h)",
                    "Operations submitted in each hour (UTC), stacked by how they ended",
                    hours, _outcome_series(hours, counted), stacked=True)


def _p50_p95(name: str, title: str, description: str,
             samples: Mapping[str, Sequence[float]], order: Sequence[str]) -> BarChart:
    groups = tuple(g for g in order if samples.get(g))
    return BarChart(name, title, description, groups, (
        Series("p50", tuple(percentile(samples[g], 0.5) for g in groups)),
        Series("p95", tuple(percentile(samples[g], 0.95) for g in groups))), unit=seconds)


def durations_by_kind(durations: Iterable[tuple[str, float]]) -> BarChart:
    """(kind, seconds) of finished operations (``reports.finished_durations``)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for kind, value in durations:
        samples[kind].append(value)
    return _p50_p95("durations-by-kind", "Duration per kind (p50, p95)",
                    "Submission to finish of finished operations", samples, sorted(samples))


def durations_by_phase(rows: Iterable[Row]) -> BarChart:
    """``report_migrations`` rows: each phase's seconds."""
    samples: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for phase in _PHASES:
            value = row[f"{phase}_seconds"]
            if value is not None:
                samples[phase].append(float(value))
    return _p50_p95("durations-by-phase", "Migration phases (p50, p95)",
                    "Seconds each migration spent queued, checkpointing, deleting the "
                    "source, restoring and collecting the artifact", samples, _PHASES)


def bytes_by_class(rows: Iterable[Row]) -> BarChart:
    """Rows of (``class_name``, ``bytes``) from ``report_checkpoints``."""
    totals = {str(r["class_name"]): float(r["bytes"] or 0) for r in rows}
    groups = tuple(sorted(totals))
    return BarChart("bytes-by-class", "Bytes checkpointed per class",
                    "Size of the verified checkpoint archives, summed per checkpoint class",
                    groups, (Series("bytes", tuple(totals[g] for g in groups)),), unit=size)


def failures_by_reason(rows: Iterable[Row]) -> BarChart:
    """Rows of (``reason``, ``kind``, ``operations``) of failed operations."""
    counted: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        counted[str(row["reason"] or "(none)"), str(row["kind"])] += float(row["operations"])
    reasons = tuple(sorted({r for r, _ in counted}))
    kinds = sorted({k for _, k in counted})
    return BarChart("failures-by-reason", "Failures by reason",
                    "Finished operations that did not succeed, by the reason they ended, "
                    "stacked by kind", reasons,
                    tuple(Series(k, tuple(counted.get((r, k), 0.0) for r in reasons))
                          for k in kinds), stacked=True)


def drain_load(drain: Row | None, children: Iterable[Row]) -> BarChart:
    """A ``report_drains`` row and its ``report_drain_children``: children per target."""
    counted: dict[tuple[str, str], int] = defaultdict(int)
    for child in children:
        outcome = (RUNNING if child["outcome"] is None
                   else OK if child["outcome"] == "Succeeded" else FAILED)
        counted[str(child["target"] or "-"), outcome] += 1
    targets = tuple(sorted({t for t, _ in counted}))
    what = (f"drain {str(drain['drain_id'])[:8]} of {drain['node']}" if drain is not None
            else "no drain yet")
    return BarChart("drain-load", f"Per-node load of a drain ({what})",
                    "Children of the drain per target node, stacked by how they ended",
                    targets, _outcome_series(targets, counted), stacked=True)


#: The charts, in page order.
NAMES = ("operations-per-hour", "durations-by-kind", "durations-by-phase",
         "bytes-by-class", "failures-by-reason", "drain-load")


class NoSuchDrain(LookupError):
    """``drain`` names no drain."""


async def load(db: Database, name: str, *, now: datetime,
               drain: str | None = None) -> BarChart:
    """Chart ``name`` (one of :data:`NAMES`) from the database as it is at ``now``. The
    drain chart shows ``drain`` (an id; :class:`NoSuchDrain` if none), or the latest."""
    if name == "operations-per-hour":
        return operations_per_hour(await reports.operations_since(
            db, now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS)),
            now)
    if name == "durations-by-kind":
        return durations_by_kind(await reports.finished_durations(db))
    if name == "durations-by-phase":
        return durations_by_phase(await reports.migration_phases(db))
    if name == "bytes-by-class":
        return bytes_by_class(await reports.bytes_by_class(db))
    if name == "failures-by-reason":
        return failures_by_reason(await reports.failures_by_reason(db))
    if name == "drain-load":
        return await _drain_load(db, drain)
    raise KeyError(name)


async def _drain_load(db: Database, drain: str | None) -> BarChart:
    found = await reports.drain_row(db, drain)
    if found is None and drain is not None:
        raise NoSuchDrain(drain)
    if found is None:
        return drain_load(None, [])
    return drain_load(found, await reports.drain_targets(db, str(found["drain_id"])))
