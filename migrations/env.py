"""Alembic environment: runs on the connection the control plane hands over.

``controlplane.store.migrate`` opens the database itself (same URL handling, same
drivers) and passes the connection in ``config.attributes["connection"]``; the plain
``alembic`` CLI (with ``alembic.ini``) gets one built from ``sqlalchemy.url`` instead.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from controlplane.store.partitions import include_in_schema_compare
from controlplane.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # Partitioned history (0009) differs from the models by design: see the hook.
        include_object=include_in_schema_compare,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_from_url() -> None:
    from controlplane.store.database import open_database

    db = open_database(config.get_main_option("sqlalchemy.url") or "")
    try:
        async with db.writer.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await db.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `cpctl db upgrade`")

given = config.attributes.get("connection")
if given is not None:
    _run(given)
else:
    asyncio.run(_run_from_url())
