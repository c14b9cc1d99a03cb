"""Wait for a condition that another process (or the database) makes true.

The one place tests poll: a cross-process condition has no event to await. It never
decides pass/fail by timing — it waits for the condition, up to a generous limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


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
