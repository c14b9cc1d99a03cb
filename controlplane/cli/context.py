"""What every CLI verb shares: the clock and the database opened from ``--db``.

Its own module so that verbs import it without importing each other (no import circle
between the verbs' modules). The parser imports it too (through
``webhook`` and ``history``), so the store is imported when a database is opened, not
here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from controlplane.clock import SystemClock
from controlplane.errors import ControlPlaneError

if TYPE_CHECKING:
    from controlplane.store.database import Database

clock = SystemClock()


class NoDatabase(ControlPlaneError):
    """``--db`` names a SQLite file that does not exist."""

    exit_code = 3


@contextlib.asynccontextmanager
async def opened(args: argparse.Namespace) -> AsyncIterator[Database]:
    """The database named by ``--db``, disposed of on the way out. A SQLite file that is
    not there is refused, naming where it was looked for, rather than created empty
    (only ``cpctl db upgrade`` creates one)."""
    from controlplane.store.database import open_database

    _refuse_missing_file(args)
    db = open_database(args.db)
    try:
        yield db
    finally:
        await db.dispose()


def _refuse_missing_file(args: argparse.Namespace) -> None:
    from controlplane.store.database import normalise_url

    backend, url = normalise_url(args.db)
    if backend == "sqlite" and getattr(args, "verb", None) != "db" and url.database and \
            not os.path.exists(url.database):
        raise NoDatabase(
            f"no database at {os.path.abspath(url.database)} (--db {args.db}; a relative "
            f"path is from the working directory, {os.getcwd()})",
            hint="run `cpctl db upgrade` to create one there, or name yours with --db or "
                 "CONTROLPLANE_DATABASE_URL")


def requester(args: argparse.Namespace) -> str:
    """Who runs this command, as its events record it (``user@host``, and the
    kubeconfig's user when it acts through one)."""
    from controlplane.app.requester import cli_requester  # reads kubeconfigs: PyYAML

    return cli_requester(getattr(args, "kubeconfig", None), getattr(args, "context", None),
                         in_cluster=bool(getattr(args, "in_cluster", False)))
