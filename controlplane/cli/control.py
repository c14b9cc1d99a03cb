"""The verbs that steer a live operation: ``cpctl cancel``, ``retarget`` and ``wake``.

A command goes through the machine's own ``accept`` (``app.operations.send_command``), so
a refused one is one line naming why, and nothing is written.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from controlplane.cli.context import clock, opened, requester
from controlplane.cli.progress import follow, succeeded
from controlplane.engine.commands import Command
from controlplane.machines.base.commands import Cancel, Retarget
from controlplane.store import queries

if TYPE_CHECKING:
    from controlplane.store.records import MachineRecord


async def _command_then_wait(args: argparse.Namespace, command: Command, what: str,
                             label: str) -> MachineRecord | None:
    """Record ``command`` for ``args.id``; with ``--wait``, follow it until it settles
    and return the settled record (``None`` without ``--wait``)."""
    from controlplane.app.operations import send_command
    from controlplane.machines.catalog import default_kinds

    async with opened(args) as db:
        args.id = await queries.resolve_machine_id(db, args.id)  # a unique prefix will do
        version = await send_command(db, default_kinds(), machine_id=args.id,
                                     command=command, now=clock.now(),
                                     requester=requester(args))
        print(f"{what} recorded for {args.id} (version {version})")
        if not args.wait:
            return None
        record = await follow(db, args.id, label, limit_seconds=args.wait_seconds)
    print(f"{args.id}: {record.phase}")
    return record


async def cancel_cmd(args: argparse.Namespace) -> int:
    await _command_then_wait(args, Cancel(), "cancel", f"cancel {args.id}")
    return 0  # with --wait: it stopped, whatever phase it stopped in


async def retarget_cmd(args: argparse.Namespace) -> int:
    record = await _command_then_wait(args, Retarget(node=args.to),
                                      f"retarget to {args.to}",
                                      f"retarget {args.id} to {args.to}")
    return 0 if record is None or succeeded(record) else 1


async def wake_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.operations import wake
    from controlplane.machines.catalog import default_kinds

    async with opened(args) as db:
        ids = (await queries.machines_indexing(db, args.key) if args.key
               else [await queries.resolve_machine_id(db, args.id)])
        n = 0
        for machine_id in ids:  # each records who asked (WakeRequested)
            n += await wake(db, default_kinds(), machine_id=machine_id, now=clock.now(),
                            requester=requester(args))
    print(f"woke {n} machine(s)")
    return 0
