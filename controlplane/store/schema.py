"""The tables, in SQLAlchemy Core. Alembic migrations create them; a test checks the two agree.

- ``events``: append-only history, ordered per machine (``machine_id, seq`` unique; on
  PostgreSQL since 0009 ``machine_id, seq, recorded_at``, in monthly partitions: see
  docs/partitions.md) and globally (``position``). Each row carries the observation facts
  that caused it.
- ``decisions``: the decision records written before revision 0007, one row per decision:
  its input and the time it was decided at. Since 0007 a decision is recorded on the first
  event it appended (``events.cause`` and ``events.input_z``; decided at ``recorded_at``),
  so history costs one row per event; old rows are read as they are.
- ``machines``: the current-state projection, lease columns and the wake schedule.
- ``machine_keys``: the wake index (pod UID -> machines that care).
- ``history_encodings``: the formats (and dictionary digests) the compressed history may
  use, checked when the store opens the database (``store.encodings``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

metadata = MetaData()


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends.

    PostgreSQL stores ``timestamptz``; SQLite stores naive UTC text in one fixed format, so
    SQL comparisons (``next_wake_at <= :now``) order correctly as strings.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass timezone-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Json = JSON().with_variant(JSONB(), "postgresql")
# History's JSON, written once and read whole or through ``->``/``->>``: text on both
# backends (PostgreSQL ``json`` since revision 0010: smaller rows and a faster replay read
# than ``jsonb``, whose containment and indexes no reader of these columns uses).
TextJson = JSON()
# SQLite only autoincrements INTEGER PRIMARY KEY, not BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")

machines = Table(
    "machines",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("phase", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("spec", TextJson, nullable=False),
    # Before 0007 the state is JSON in ``state``; since, compressed in ``state_z`` (see
    # ``store.codec``), and ``state`` holds JSON null: small enough to stay inside the row,
    # so a commit writes no TOAST.
    Column("state", Json, nullable=False),
    Column("state_z", LargeBinary, nullable=True),
    Column("terminal", Boolean, nullable=False, server_default=text("false")),
    # The transactional outbox: the actions of the last committed decision, written in the
    # same UPDATE as its events and cleared when the lease is released. A worker that dies
    # between commit and action leaves them here; the next owner performs them first.
    Column("pending_actions", Json, nullable=False, server_default=text("'[]'")),
    Column("next_wake_at", UtcDateTime, nullable=True),
    # Bumped by every external wake; a worker that claimed at wake_seq N and releases
    # at N+k knows a wake arrived while it worked and must not sleep past it.
    Column("wake_seq", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_token", String(64), nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # Admission (migration 0002): the workload (namespace/name) an operation acts on, the
    # node it moves load off, and whether it is held in the admission queue by a limit.
    Column("workload", String(320), nullable=True),
    Column("source_node", String(253), nullable=True),
    Column("held", Boolean, nullable=False, server_default=text("false")),
)
# Due = next_wake_at <= now. Sleeping-forever and finished machines have NULL there, so
# the index holds only machines that will need a worker.
Index(
    "ix_machines_due",
    machines.c.next_wake_at,
    postgresql_where=machines.c.next_wake_at.is_not(None),
    sqlite_where=machines.c.next_wake_at.is_not(None),
)
Index("ix_machines_kind_phase", machines.c.kind, machines.c.phase)
# One live operation per workload, enforced by the database, so two concurrent
# submitters cannot both pass the check.
Index(
    "ux_machines_live_workload",
    machines.c.workload,
    unique=True,
    postgresql_where=machines.c.terminal.is_(False) & machines.c.workload.is_not(None),
    sqlite_where=machines.c.terminal.is_(False) & machines.c.workload.is_not(None),
)
Index(
    "ix_machines_held",
    machines.c.created_at,
    postgresql_where=machines.c.held.is_(True),
    sqlite_where=machines.c.held.is_(True),
)

events = Table(
    "events",
    metadata,
    Column("position", BigId, primary_key=True, autoincrement=True),
    Column("machine_id", String(64), ForeignKey("machines.id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(128), nullable=False),
    Column("data", TextJson, nullable=False),
    # Before 0007 the facts are JSON in ``facts``; since, compressed in ``facts_z``, and
    # ``facts`` holds JSON null.
    Column("facts", TextJson, nullable=False),
    Column("facts_z", LargeBinary, nullable=True),
    Column("recorded_at", UtcDateTime, nullable=False),
    Column("worker_id", String(128), nullable=False),
    # On the first event of each decision (since 0007): observation | command | engine, and
    # the decision's input compressed (see ``decisions`` for the rows written before).
    Column("cause", String(16), nullable=True),
    Column("input_z", LargeBinary, nullable=True),
    UniqueConstraint("machine_id", "seq", name="uq_events_machine_seq"),
)
Index("ix_events_recorded_at", events.c.recorded_at)
Index("ix_events_type", events.c.type)

decisions = Table(
    "decisions",
    metadata,
    Column("machine_id", String(64), ForeignKey("machines.id"), primary_key=True),
    # The seq of the first event this decision appended; its events run to the next row's.
    Column("first_seq", Integer, primary_key=True),
    # observation | command | engine (engine rows, e.g. Submitted or ActionFailed, are
    # inputs to the machine, not decisions, and are applied but not re-decided by verify).
    Column("cause", String(16), nullable=False),
    Column("input", Json, nullable=False),
    Column("decided_at", UtcDateTime, nullable=False),
)

machine_keys = Table(
    "machine_keys",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("machine_id", String(64), ForeignKey("machines.id"), primary_key=True),
)
Index("ix_machine_keys_machine", machine_keys.c.machine_id)

# Retention (migration 0008): one row per pruned operation, written before its events,
# decisions and machines row are deleted (``store/retention.py``). The reporting views
# read it beside the live tables, and count a machine that has a summary from the
# summary alone, so the reports over all time add up the same before, during and after
# a prune. ``milestones`` holds the view rows the operation had when it was pruned
# (``operation``, ``migration``, ``checkpoints``, ``drain``, ``drain_children``), times as
# the views returned them.
operation_summaries = Table(
    "operation_summaries",
    metadata,
    Column("machine_id", String(64), primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("workload", String(320), nullable=True),
    Column("source_node", String(253), nullable=True),
    Column("target_node", String(253), nullable=True),
    Column("final_node", String(253), nullable=True),
    Column("outcome", String(64), nullable=False),
    Column("reason", String(1024), nullable=True),
    Column("message", String(4096), nullable=True),
    Column("class_name", String(253), nullable=False),
    Column("requester", String(320), nullable=True),
    Column("submitted_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("events", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=True),
    Column("milestones", Json, nullable=False),
    Column("pruned_at", UtcDateTime, nullable=False),
)
Index("ix_operation_summaries_submitted", operation_summaries.c.submitted_at)

# Since 0011: one row per format byte the compressed history columns (``facts_z``,
# ``input_z``, ``state_z``) may hold, with the SHA-256 of its dictionary (``store.codec``).
# A few rows at most, read once when the store opens the database.
history_encodings = Table(
    "history_encodings",
    metadata,
    Column("format", SmallInteger, primary_key=True, autoincrement=False),
    Column("dictionary_sha256", String(64), nullable=False),
)

__all__ = ["decisions", "events", "history_encodings", "machine_keys", "machines",
           "metadata", "operation_summaries"]
