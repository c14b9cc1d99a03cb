"""Admission: the workload and source node of an operation, and the admission queue.

Adds ``machines.workload``, ``machines.source_node`` and ``machines.held``; a partial
unique index makes "one live operation per workload" a database guarantee; a partial
index serves the admitter's FIFO scan of held machines.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("workload", sa.String(320), nullable=True))
        batch.add_column(sa.Column("source_node", sa.String(253), nullable=True))
        batch.add_column(sa.Column("held", sa.Boolean, nullable=False,
                                   server_default=sa.text("false")))
    live = sa.text("terminal IS false AND workload IS NOT NULL")
    op.create_index("ux_machines_live_workload", "machines", ["workload"], unique=True,
                    postgresql_where=live, sqlite_where=sa.text(
                        "terminal IS 0 AND workload IS NOT NULL"))
    op.create_index("ix_machines_held", "machines", ["created_at"],
                    postgresql_where=sa.text("held IS true"),
                    sqlite_where=sa.text("held IS 1"))


def downgrade() -> None:
    op.drop_index("ix_machines_held", "machines")
    op.drop_index("ux_machines_live_workload", "machines")
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("held")
        batch.drop_column("source_node")
        batch.drop_column("workload")
