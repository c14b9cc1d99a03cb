"""A database written by the product before its events were typed still reads exactly:
every machine folds to the projection stored then, every recorded decision is re-made
with the same events, and every kind and event type of that history is covered.

The rows (``todays_rows.sqlite``) were recorded once by ``tests/golden/todays_rows.py``
from the code as it was; they are never re-recorded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from controlplane.app.replay import rebuild, verify
from controlplane.machines.catalog import default_kinds, product_kinds
from controlplane.store import migrate, queries
from controlplane.store.database import open_database
from tests.golden.todays_rows import ROWS

#: What the recording holds: the check below fails if a kind or a path goes missing.
RECORDED = {("checkpoint", "Succeeded"), ("migration", "Succeeded"), ("suspend", "Suspended"),
            ("resume", "Resumed"), ("restore", "Succeeded"), ("migration", "Cancelled"),
            ("drain", "Succeeded")}
#: Of the recording's 55 decision records, those ``replay --verify`` re-makes (caused by an
#: observation or a command) and those it has nothing to re-make (the engine's own).
REMADE, NOT_REDECIDED = 47, 8


async def test_rows_written_before_typed_events_fold_and_verify_with_todays_deciders(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "rows.sqlite"
    shutil.copyfile(ROWS, copy)
    db = open_database(f"sqlite:///{copy}")
    try:
        await migrate.upgrade(db)  # a no-op unless the schema moved on since the recording
        machines = await queries.list_machines(db, queries.MachineFilter(limit=1000))
        assert {(m.kind, m.phase) for m in machines} == RECORDED
        assert {m.kind for m in machines} == {d.kind for d in product_kinds()}
        before = {m.id: m.state for m in machines}
        rebuilt = await rebuild(db, default_kinds(), now=max(m.updated_at for m in machines))
        verified = await verify(db, default_kinds())
        assert rebuilt.mismatches == []
        assert verified.mismatches == []
        assert (rebuilt.machines, verified.machines) == (len(machines), len(machines))
        # Every decision an observation or a command caused is re-made; the engine's own
        # records (each machine's Submitted, the ActionFailed it recorded) are not
        # decisions to re-make and are not counted as re-made.
        assert (verified.decisions, verified.not_redecided) == (REMADE, NOT_REDECIDED)
        after = {m.id: m.state for m in await queries.list_machines(
            db, queries.MachineFilter(limit=1000))}
        assert after == before
    finally:
        await db.dispose()
