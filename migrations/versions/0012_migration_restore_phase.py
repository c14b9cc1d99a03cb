"""``report_migrations.restore_seconds`` only where the restore followed the source's end.

The column is "source gone to the restored pod verified", the time the workload is down
in a migration through the registry. A streamed migration (``transfer: stream``) verifies
its restore *before* it deletes the source, so the difference was negative and dragged
every median and mean of the phase down. The column is now NULL where the restore came
first (as it already was for a lazy migration, which verifies no artifact), and the
other phases stand; a streamed migration's downtime is in its history (``cpctl
history``), not in this column.

The view is rebuilt from revision 0008's own definition, with that one column wrapped,
for the rows still in the history and those kept only as summaries alike; the downgrade
puts 0008's definition back.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _revision_0008() -> ModuleType:
    path = Path(__file__).with_name("0008_operation_summaries.py")
    spec = importlib.util.spec_from_file_location("_revision_0008", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _view(*, restore_after_source: bool) -> str:
    rev = _revision_0008()
    sql = rev._Sql(op.get_bind().dialect.name == "postgresql")
    text: str = rev._migrations(sql, summaries=True)
    if not restore_after_source:
        return text
    milestone = (sql.time("s.milestones", "migration", "restore_verified_at"),
                 sql.time("s.milestones", "migration", "source_deleted_at"))
    for restored, deleted in (("t.restore_verified_at", "t.source_deleted_at"), milestone):
        seconds = sql.seconds(restored, deleted)
        assert text.count(seconds) == 1, f"0008's view no longer computes {seconds} once"
        text = text.replace(seconds, f"CASE WHEN {seconds} >= 0 THEN {seconds} END")
    return text


def _replace(*, restore_after_source: bool) -> None:
    op.execute("DROP VIEW report_migrations")
    op.execute(_view(restore_after_source=restore_after_source))


def upgrade() -> None:
    _replace(restore_after_source=True)


def downgrade() -> None:
    _replace(restore_after_source=False)
