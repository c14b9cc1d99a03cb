"""``cpctl db``: the database's schema — upgrade it to this version, or say which it is."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from controlplane.cli.context import opened

if TYPE_CHECKING:
    pass


async def db_upgrade(args: argparse.Namespace) -> int:
    from controlplane.store import migrate

    async with opened(args) as db:
        before, after = await migrate.upgrade(db)
    print(f"schema at {after} (was {before or 'empty'}) on {db.display_url}")
    return 0


async def db_current(args: argparse.Namespace) -> int:
    from controlplane.store import migrate

    async with opened(args) as db:
        current = await migrate.current_revision(db)
    head = migrate.head_revision()
    state = "up to date" if current == head else f"needs upgrade to {head}"
    print(f"schema {current or 'empty'} ({state}) on {db.display_url}")
    return 0 if current == head else 4
