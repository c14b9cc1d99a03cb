"""``cpctl checkpoints [NAMESPACE/POD]``: the checkpoints there are to restore from,
newest first (read from the store: one query, no cluster access)."""

from __future__ import annotations

import argparse

from controlplane.cli import render
from controlplane.cli.context import opened
from controlplane.store import migrate, queries


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", metavar="NAMESPACE/POD",
                   help="only the checkpoints of this workload (default: every workload)")


async def checkpoints_cmd(args: argparse.Namespace) -> int:
    async with opened(args) as db:
        await migrate.require_current(db)
        found = await queries.verified_captures(db, workload=args.workload)
    render.table(["id", "kind", "workload", "artifact", "verified"],
                 [(c.machine.id, c.machine.kind, c.machine.workload, c.verified.get("pinned"),
                   c.verified_at) for c in found])
    return 0
