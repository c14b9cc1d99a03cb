"""Record which encodings the compressed history uses, so an unreadable database is refused.

Since 0007 facts, decision inputs and states are stored as a format byte and a zstd frame
(``store.codec``); ``0x01`` is dictionary v1, but the byte does not say which dictionary
bytes those were. ``history_encodings`` names each format the rows may use and the
SHA-256 of its dictionary; the store reads it when it opens the database and refuses one
that names a format or a digest it does not have (``store.encodings``), before any row.

Every compressed row written so far is format 0x01 with dictionary v1, so this revision
records that pair itself (the digest is written here as it was when those rows were,
never imported from the codec of the day). ``migrate.upgrade`` adds the format the
running code writes, if it is another.

The downgrade drops the table, and is refused while it names anything but v1: the code
of 0010 reads v1 only, and would fail row by row on the rest.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

V1 = (1, "5e7ad39132b7b71d6a24553c112eda56110f9d4f5d3b76dcf8126f548775455e")


def upgrade() -> None:
    table = op.create_table(
        "history_encodings",
        sa.Column("format", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("dictionary_sha256", sa.String(64), nullable=False),
    )
    op.bulk_insert(table, [{"format": V1[0], "dictionary_sha256": V1[1]}])


def downgrade() -> None:
    recorded = op.get_bind().execute(sa.text(
        "SELECT format, dictionary_sha256 FROM history_encodings")).all()
    others = sorted(f"{fmt:#04x} (dictionary sha256 {digest})"
                    for fmt, digest in recorded if (fmt, digest) != V1)
    if others:
        raise RuntimeError(f"history may hold rows in encoding {', '.join(others)}, which "
                           "the code of revision 0010 cannot read; a downgrade below 0011 "
                           "would drop the only record of them")
    op.drop_table("history_encodings")
