"""``cpctl checkpoints --unrecorded [--collect]``: the checkpoints in the registry that the
history does not record (made after the backup a database was restored from), found by
their provenance (:mod:`controlplane.app.unrecorded`), and deleted with ``--collect``.

Reached from :mod:`controlplane.cli.checkpoints`; the registry is the one the
``--registry-*`` flags name, as for ``cpctl worker``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from controlplane.cli import render
from controlplane.cli.context import opened

if TYPE_CHECKING:
    from controlplane.app.unrecorded import Unrecorded

EXPLAINED = """\
These checkpoints name no operation the history records: after a restore from a backup,
the ones made after the backup was taken. Each is kept until deleted: restore one by
submitting a restore of its artifact (docs/install.md, "Backup and restore"), or delete
them all with --collect."""


async def unrecorded_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.checkpoints import list_checkpoints
    from controlplane.app.unrecorded import collect, find_unrecorded
    from controlplane.store import migrate
    from controlplane.wiring.cluster import listing_registry_from_args

    registry = listing_registry_from_args(args)
    try:
        async with opened(args) as db:
            await migrate.require_current(db)
            repositories = list(args.repository)
            if not repositories:
                known, _ = await list_checkpoints(db, limit=1_000_000)
                repositories = sorted({c.artifact.split("@", 1)[0] for c in known})
            if not repositories:
                print("no repository to look in: the history records no checkpoint; name "
                      "one with --repository REGISTRY/REPO")
                return 0

            def reading(repository: str, tags: int) -> None:
                sys.stderr.write(f"reading {repository}: {tags} tag(s)\n")
            found = await find_unrecorded(db, registry, repositories, progress=reading)
        _show(args, found, repositories)
        if args.collect and found:
            def deleted(item: Unrecorded) -> None:
                sys.stderr.write(f"deleted {item.artifact}\n")
            count = await collect(registry, found, deleted=deleted)
            sys.stderr.write(f"{count} unrecorded checkpoint(s) deleted\n")
    finally:
        await registry.close()
    return 0


def _show(args: argparse.Namespace, found: list[Unrecorded], repositories: list[str]) -> None:
    if args.output in ("json", "yaml"):
        render.structured({"items": [f.to_json() for f in found],
                           "repositories": repositories, "collected": bool(args.collect)},
                          args.output)
    elif not found:
        print(f"every checkpoint in {', '.join(repositories)} is recorded in the history")
    else:
        render.table(["checkpoint id", "workload", "node", "created", "artifact"],
                     [(f.checkpoint_id, f.workload or "-", f.node or "-", f.created or "-",
                       f.artifact) for f in found], wide=args.wide, whole=[0],
                     max_width=256, fill=4)
        if not args.collect:
            sys.stderr.write(EXPLAINED + "\n")
