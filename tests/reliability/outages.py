"""Database outages for a campaign: its throwaway PostgreSQL stopped and started again.

A :data:`~tests.reliability.campaign.Disturber` that waits until the campaign has
finished a number of migrations (so the workers are up and busy), stops the server (a
fast shutdown: every connection cut, as in a crash or failover), keeps it down for a
while and starts it again. While it is down, ``database_up`` is clear: the chaos task
restarts no worker then, since a worker that starts against a stopped database exits 3
by design. Used by ``test_database_restart.py`` and by the ``soak`` profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tests.reliability.campaign import CampaignResult, Disturber
from tests.reliability.throwaway_pg import ThrowawayPostgres


def outages(server: ThrowawayPostgres, *, after: tuple[int, ...], down_seconds: float,
            database_up: asyncio.Event | None = None) -> Disturber:
    """Stop the server once ``after[i]`` migrations have finished, for ``down_seconds``."""
    async def disturb(result: CampaignResult, stop: asyncio.Event) -> None:
        for finished in after:
            while sum(result.outcomes.values()) < finished and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await stop.wait()  # polls the campaign's progress
            if stop.is_set():
                return
            started = time.monotonic()
            if database_up is not None:
                database_up.clear()
            await asyncio.to_thread(server.stop)
            result.db_outages += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(down_seconds):
                    await stop.wait()  # the outage itself: nothing to wait for but time
            await asyncio.to_thread(server.start)
            if database_up is not None:
                database_up.set()
            result.db_down_seconds += time.monotonic() - started
    return disturb
