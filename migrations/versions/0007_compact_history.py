"""Compact history: compressed facts, inputs and state; a decision recorded on its event.

Measured with ``python -m bench.scale --migrations 1000 --nodes 100``: 24 rows and about
51 KiB per migration, most of it JSON repeated from row to row (tag annotations, the pod
an observation saw, the class in every state). From this revision new rows store:

- ``events.facts_z``: the facts, compressed (``store.codec``); ``facts`` holds JSON null;
- ``events.cause`` and ``events.input_z`` on the first event of each decision: the
  decision record, without a second row and a second index entry (decided at the event's
  ``recorded_at``); ``decisions`` keeps the rows written before and gets no new ones;
- ``machines.state_z``: the projection's state, compressed; ``state`` holds JSON null.

Old rows are left as they are and read as they are: every reader takes the compressed
column when it is set and the JSON one otherwise.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (
    ("events", sa.Column("facts_z", sa.LargeBinary(), nullable=True)),
    ("events", sa.Column("cause", sa.String(16), nullable=True)),
    ("events", sa.Column("input_z", sa.LargeBinary(), nullable=True)),
    ("machines", sa.Column("state_z", sa.LargeBinary(), nullable=True)),
)


def upgrade() -> None:
    for table, column in COLUMNS:
        op.add_column(table, column)


def downgrade() -> None:
    # Rows written since 0007 keep their history only in the compressed columns: a
    # downgrade would lose it, so it is refused while any exists.
    bind = op.get_bind()
    compact = bind.execute(sa.text(
        "SELECT 1 FROM events WHERE facts_z IS NOT NULL OR input_z IS NOT NULL LIMIT 1"
    )).first()
    if compact is not None:
        raise RuntimeError("history written since revision 0007 is stored compressed; "
                           "a downgrade below 0007 would lose it")
    for table, column in reversed(COLUMNS):
        # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of the table would trip over
        # the reporting views that read it.
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
