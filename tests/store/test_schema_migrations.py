"""The schema exists only through Alembic, and every migration runs from empty on both backends."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from controlplane.store import migrate
from controlplane.store.database import open_database
from controlplane.store.errors import SchemaNotReady
from controlplane.store.partitions import include_in_schema_compare
from controlplane.store.schema import metadata


async def test_upgrade_from_empty_reaches_head_and_matches_the_models(db_url: str) -> None:
    """Every migration applies from an empty database, and the result is exactly the models
    (but for what partitioning the history on PostgreSQL changes on purpose: the partitions
    and the partition key in the unique key, hidden by the same hook ``migrations/env.py``
    gives Alembic)."""
    db = open_database(db_url)
    try:
        before, after = await migrate.upgrade(db)
        assert (before, after) == (None, migrate.head_revision())
        async with db.reader.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(
                    sync, opts={"include_object": include_in_schema_compare}), metadata)
            )
            tables = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
        assert diff == []
        assert {"machines", "events", "decisions", "machine_keys"} <= tables
    finally:
        await db.dispose()


async def test_upgrade_twice_is_a_no_op(db_url: str) -> None:
    db = open_database(db_url)
    try:
        await migrate.upgrade(db)
        assert await migrate.upgrade(db) == (migrate.head_revision(), migrate.head_revision())
    finally:
        await db.dispose()


async def test_downgrade_to_base_then_upgrade_again(db_url: str) -> None:
    """The downgrade path works, so a schema rollback is possible."""
    db = open_database(db_url)
    try:
        await migrate.upgrade(db)
        await migrate.downgrade(db, "base")
        assert await migrate.current_revision(db) is None
        await migrate.upgrade(db)
        await migrate.require_current(db)
    finally:
        await db.dispose()


async def test_an_unmigrated_database_is_refused_with_the_fix(db_url: str) -> None:
    db = open_database(db_url)
    try:
        with pytest.raises(SchemaNotReady, match="cpctl db upgrade"):
            await migrate.require_current(db)
    finally:
        await db.dispose()


async def test_upgrading_a_populated_0001_database_keeps_its_machines(db_url: str) -> None:
    """The upgrade path operators take: data written under 0001 survives 0002."""
    db = open_database(db_url)
    try:
        await migrate.upgrade(db, "0001")
        async with db.writer.begin() as conn:
            await conn.execute(text(
                "INSERT INTO machines (id, kind, phase, version, spec, state, terminal, "
                "pending_actions, wake_seq, attempts, created_at, updated_at) VALUES "
                "('old', 'steps', 'Running', 1, '{}', '{}', false, '[]', 0, 0, "
                "'2026-01-01 00:00:00', '2026-01-01 00:00:00')"))
        await migrate.upgrade(db)
        async with db.reader.connect() as conn:
            row = (await conn.execute(text(
                "SELECT id, phase, held, workload FROM machines"))).one()
        assert (row.id, row.phase, bool(row.held), row.workload) == ("old", "Running", False,
                                                                     None)
    finally:
        await db.dispose()
