"""``cpctl report``: the store's SQL reports (``store.reports``) as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import sys

from controlplane.cli import render
from controlplane.cli.context import opened


async def report_cmd(args: argparse.Namespace) -> int:
    from controlplane.store import migrate, reports

    async with opened(args) as db:
        await migrate.require_current(db)
        summary = await reports.report(db, report=args.report, by=args.by,
                                       since=args.since)
    if args.output in ("json", "yaml"):
        render.structured(summary, args.output)
    elif args.output == "csv":
        writer = csv.writer(sys.stdout)
        if summary:
            writer.writerow(list(summary[0]))
        writer.writerows([list(r.values()) for r in summary])
    else:
        keys = list(summary[0]) if summary else [args.by, "count"]
        render.table([HEADERS.get(k, k.replace("_", " ")) for k in keys],
                     [[_shown(k, r[k]) for k in keys] for r in summary], wide=args.wide)
    return 0


#: The table's short headers, each with its unit (JSON, YAML and CSV keep the field
#: names, for scripts): ``P50_CHECKPOINT_SECONDS`` wrapped a 110-column terminal.
HEADERS = {
    "count": "n", "succeeded": "ok", "failed": "fail", "success_rate": "ok %",
    "running": "run", "p50_seconds": "p50 s", "p95_seconds": "p95 s",
    "p50_queued_seconds": "queue s", "p50_checkpoint_seconds": "ckpt s",
    "p50_delete_seconds": "delete s",
    "p50_restore_seconds": "restore s", "p50_gc_seconds": "gc s", "bytes": "moved",
    "duration_seconds": "took s", "p50_child_seconds": "child p50 s",
    "p95_child_seconds": "child p95 s", "in_flight": "in flight",
}


def _shown(key: str, value: object) -> object:
    """A value as the table shows it: a rate as a percentage, bytes in binary units,
    seconds to the hundredth."""
    if value is None:
        return None
    if key == "success_rate" and isinstance(value, (int, float)):
        return f"{value * 100:.1f}%"
    if key == "bytes" and isinstance(value, int):
        return _binary(value)
    return f"{value:.2f}" if isinstance(value, float) else value


def _binary(size: int) -> str:
    amount, unit = float(size), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if amount < 1024:
            break
        amount, unit = amount / 1024, bigger
    return f"{size} B" if unit == "B" else f"{amount:.1f} {unit}"
