"""What every CLI verb shares: the clock and the database opened from ``--db``.

Its own module so that verbs import it without importing each other (no import circle
between ``commands``, ``cluster`` and ``serve``).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

from controlplane.app.requester import cli_requester
from controlplane.clock import SystemClock
from controlplane.store.database import Database, open_database

clock = SystemClock()


@contextlib.asynccontextmanager
async def opened(args: argparse.Namespace) -> AsyncIterator[Database]:
    """The database named by ``--db``, disposed of on the way out."""
    db = open_database(args.db)
    try:
        yield db
    finally:
        await db.dispose()


def requester(args: argparse.Namespace) -> str:
    """Who runs this command, as its events record it (``user@host``, and the
    kubeconfig's user when it acts through one)."""
    return cli_requester(getattr(args, "kubeconfig", None), getattr(args, "context", None),
                         in_cluster=bool(getattr(args, "in_cluster", False)))
