"""Wait for a condition that another process (or the database) makes true.

The one place tests poll: a cross-process condition has no event to await. It never
decides pass/fail by timing — it waits for the condition, up to a generous limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, limit_seconds: float = 60,
                     every: float = 0.02, what: str = "condition") -> None:
    async with asyncio.timeout(limit_seconds):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(every)


def wait_for(check: Callable[[], T | None], what: str, limit: float = 60) -> T:
    """Poll a condition another process makes true until ``limit`` seconds; its value."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {limit:g} s waiting for {what}")
