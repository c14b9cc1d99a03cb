"""``cpctl report``: the store's SQL reports (``store.reports``) as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import sys
from typing import TYPE_CHECKING

from controlplane.cli import render
from controlplane.cli.context import opened

if TYPE_CHECKING:
    pass


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
        headers = list(summary[0]) if summary else [args.by, "count"]
        render.table(headers, [[_fmt(v) for v in r.values()] for r in summary],
                     wide=args.wide)
    return 0


def _fmt(value: object) -> object:
    return f"{value:.3f}" if isinstance(value, float) else value
