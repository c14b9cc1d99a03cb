"""What every CLI verb shares: the clock and the database opened from ``--db``.

Its own module so that verbs import it without importing each other (no import circle
between the verbs' modules). The parser imports it too (through
``webhook`` and ``history``), so the store is imported when a database is opened, not
here.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from controlplane.clock import SystemClock

if TYPE_CHECKING:
    from controlplane.store.database import Database

clock = SystemClock()


@contextlib.asynccontextmanager
async def opened(args: argparse.Namespace) -> AsyncIterator[Database]:
    """The database named by ``--db``, disposed of on the way out."""
    from controlplane.store.database import open_database

    db = open_database(args.db)
    try:
        yield db
    finally:
        await db.dispose()


def requester(args: argparse.Namespace) -> str:
    """Who runs this command, as its events record it (``user@host``, and the
    kubeconfig's user when it acts through one)."""
    from controlplane.app.requester import cli_requester  # reads kubeconfigs: PyYAML

    return cli_requester(getattr(args, "kubeconfig", None), getattr(args, "context", None),
                         in_cluster=bool(getattr(args, "in_cluster", False)))
