"""Plain read models returned by the store (no SQLAlchemy types leak out of ``store``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.engine.decider import Cause
from controlplane.engine.jsonvalue import JsonObject


@dataclass(frozen=True)
class MachineRecord:
    """One row of the ``machines`` projection."""

    id: str
    kind: str
    phase: str
    version: int
    spec: JsonObject
    state: JsonObject
    terminal: bool
    pending_actions: list[JsonObject]
    next_wake_at: datetime | None
    wake_seq: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempts: int
    created_at: datetime
    updated_at: datetime
    workload: str | None = None
    source_node: str | None = None
    held: bool = False


@dataclass(frozen=True)
class RecordedEvent:
    """One row of the ``events`` log."""

    position: int
    machine_id: str
    seq: int
    type: str
    data: JsonObject
    facts: JsonObject
    recorded_at: datetime
    worker_id: str


@dataclass(frozen=True)
class DecisionRecord:
    """One row of ``decisions``: what a decision (or command) was made on, and when."""

    machine_id: str
    first_seq: int
    cause: Cause
    input: JsonObject
    decided_at: datetime


@dataclass(frozen=True)
class Lease:
    """Proof that a worker owns a machine until ``expires_at``; its token fences commits."""

    machine_id: str
    owner: str
    token: str
    expires_at: datetime
    wake_seq: int


@dataclass(frozen=True)
class Claimed:
    """A machine a worker claimed: its projection and the lease."""

    record: MachineRecord
    lease: Lease


@dataclass(frozen=True)
class Projection:
    """The new current state a commit writes next to its events."""

    phase: str
    state: JsonObject
    terminal: bool
    wake_keys: frozenset[str] | None = None  # None: unchanged
