"""The one place that reads the wall clock and makes ids or random numbers.

Everything else receives ``now`` and ids as arguments (ruff's banned-api rule enforces
it), which is what keeps ``decide``/``evolve`` replayable. Called by the worker runtime,
the CLI and tests (through :class:`FakeClock`).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Something that tells the time (UTC, timezone-aware)."""

    def now(self) -> datetime: ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass
class FakeClock:
    """A clock tests move by hand, so no test ever sleeps to make time pass."""

    current: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> datetime:
        self.current = self.current + timedelta(seconds=seconds)
        return self.current


def new_id() -> str:
    """A fresh machine / lease / worker id (random UUID4, as text)."""
    return str(uuid.uuid4())


def jitter(low: float, high: float) -> float:
    """A random float in [low, high): for backoff jitter in the worker shell."""
    return random.uniform(low, high)


def instant(text: str) -> datetime:
    """An ISO 8601 time, UTC unless it says otherwise; ``ValueError`` when it is not one."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
