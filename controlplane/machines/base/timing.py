"""Time in the product machines: deadlines, registry polling, re-issue and backoff.

Events carry the decision time as ``data["at"]`` (ISO text) because ``evolve`` has no
clock; deadlines are computed from it. Registries have no watch, so waiting on a tag
polls on a deterministic backoff schedule (:func:`next_poll`); a request whose action
failed retryably is issued again after :func:`reissue_backoff`. Pure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from controlplane.machines.base.failures import ActionError

#: An action whose effect is not observed this long after it was issued is issued again
#: (with a new key): this heals a crash between the commit and the action.
REISSUE_AFTER = timedelta(seconds=30)


#: First and longest interval between registry probes while waiting on a tag.
POLL_FIRST = timedelta(seconds=2)


POLL_MAX = timedelta(seconds=30)


#: A request whose action failed with a *retryable* error (the worker's own retries of a
#: 429/5xx/409 ran out) is issued again by its decider, after ``reissue_backoff``, up to
#: this many attempts in all; a refusal (403, 422...) or the last attempt's failure ends
#: the step as before.
REQUEST_ATTEMPTS = 4


def seconds(n: int) -> timedelta:
    return timedelta(seconds=n)


def earliest(*moments: datetime | None) -> datetime | None:
    """The earliest of the given times, ignoring ``None``."""
    present = [m for m in moments if m is not None]
    return min(present) if present else None


def next_poll(since: datetime, now: datetime) -> datetime:
    """Next registry probe time: 2 s, 4 s, 8 s ... after ``since``, then every 30 s.

    A pure function of (``since``, ``now``), so no event is needed per probe.
    """
    step, moment = POLL_FIRST, since + POLL_FIRST
    while moment <= now:
        step = min(step * 2, POLL_MAX)
        moment += step
    return moment


def may_reissue(error: ActionError, attempt: int) -> bool:
    """Whether a request whose ``attempt`` failed with ``error`` is issued again."""
    return error.retryable and attempt < REQUEST_ATTEMPTS


def reissue_backoff(attempt: int) -> timedelta:
    """How long after a failed ``attempt`` was issued its retry is: 2 s, 4 s, 8 s..."""
    return backoff(attempt, base=POLL_FIRST, cap=POLL_MAX)


def backoff(attempt: int, *, base: timedelta, cap: timedelta) -> timedelta:
    """Exponential backoff for retry ``attempt`` (1-based), capped."""
    grown: timedelta = base * (2 ** min(max(attempt - 1, 0), 30))
    return min(grown, cap)
