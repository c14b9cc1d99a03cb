"""The event store: events, decisions, the machines projection and the wake index.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "machines",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("phase", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("terminal", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("pending_actions", JSON, nullable=False, server_default=sa.text("'[]'")),
        sa.Column("next_wake_at", TS, nullable=True),
        sa.Column("wake_seq", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", TS, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index(
        "ix_machines_due", "machines", ["next_wake_at"],
        postgresql_where=sa.text("next_wake_at IS NOT NULL"),
        sqlite_where=sa.text("next_wake_at IS NOT NULL"),
    )
    op.create_index("ix_machines_kind_phase", "machines", ["kind", "phase"])

    op.create_table(
        "events",
        sa.Column("position", BIGID, primary_key=True, autoincrement=True),
        sa.Column("machine_id", sa.String(64), sa.ForeignKey("machines.id"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.Column("facts", JSON, nullable=False),
        sa.Column("recorded_at", TS, nullable=False),
        sa.Column("worker_id", sa.String(128), nullable=False),
        sa.UniqueConstraint("machine_id", "seq", name="uq_events_machine_seq"),
    )
    op.create_index("ix_events_recorded_at", "events", ["recorded_at"])
    op.create_index("ix_events_type", "events", ["type"])

    op.create_table(
        "decisions",
        sa.Column("machine_id", sa.String(64), sa.ForeignKey("machines.id"), primary_key=True),
        sa.Column("first_seq", sa.Integer, primary_key=True),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("input", JSON, nullable=False),
        sa.Column("decided_at", TS, nullable=False),
    )

    op.create_table(
        "machine_keys",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("machine_id", sa.String(64), sa.ForeignKey("machines.id"), primary_key=True),
    )
    op.create_index("ix_machine_keys_machine", "machine_keys", ["machine_id"])


def downgrade() -> None:
    op.drop_table("machine_keys")
    op.drop_table("decisions")
    op.drop_table("events")
    op.drop_table("machines")
