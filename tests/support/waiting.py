"""Wait for a condition that another process (or the database) makes true.

The one place tests poll: a cross-process condition has no event to await. It never
decides pass/fail by timing — it waits for the condition, up to a generous limit — and
when the limit passes, the failure says what it waited for and what it saw last, so a
red run can be read without rerunning it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast, overload

T = TypeVar("T")

_LONGEST = 2000  # characters of what was last seen kept in a failure's message


class WaitTimedOut(AssertionError, TimeoutError):
    """The condition did not hold in time: a test failure naming what was awaited and what
    was last seen. Also a ``TimeoutError``: callers written when :func:`eventually` raised
    a bare one catch it to add their own context, and still may."""


@overload
async def eventually(check: Callable[[], Awaitable[T]], *, limit_seconds: float = 60,
                     every: float = 0.02, what: str = "condition",
                     describe: Callable[[], object] | None = None,
                     retry_on: tuple[type[Exception], ...] = ()) -> T: ...


@overload
async def eventually(check: Callable[[], T], *, limit_seconds: float = 60,
                     every: float = 0.02, what: str = "condition",
                     describe: Callable[[], object] | None = None,
                     retry_on: tuple[type[Exception], ...] = ()) -> T: ...


async def eventually(check: Callable[[], Awaitable[T] | T], *, limit_seconds: float = 60,
                     every: float = 0.02, what: str = "condition",
                     describe: Callable[[], object] | None = None,
                     retry_on: tuple[type[Exception], ...] = ()) -> T:
    """Call ``check`` (plain or async) every ``every`` seconds until its result is truthy;
    return that result.

    After ``limit_seconds`` raise :class:`WaitTimedOut`, whose message names ``what`` and
    what was last seen: ``describe()`` when given, else the repr of the check's last result
    (or of the exception it last raised, for one of ``retry_on``). Any other exception from
    ``check`` ends the wait at once: a check raises to say its condition can no longer hold.
    """
    last: list[object] = []  # empty until a check has returned (or raised a retried error)
    deadline = asyncio.timeout(limit_seconds)
    try:
        async with deadline:
            while True:
                try:
                    outcome = check()
                    result = cast(T, await outcome if inspect.isawaitable(outcome) else outcome)
                except retry_on as exc:
                    last[:] = [exc]
                else:
                    if result:
                        return result
                    last[:] = [result]
                await asyncio.sleep(every)
    except TimeoutError:
        if not deadline.expired():
            raise  # the check's own timeout, not ours: it ends the wait like any error
        seen = _shown(describe()) if describe is not None else \
            repr(last[0]) if last else "nothing (the check never returned)"
        raise WaitTimedOut(f"timed out after {limit_seconds:g} s waiting for {what}; "
                           f"last saw: {_clip(seen)}") from None


def wait_for(check: Callable[[], T | None], what: str, limit: float = 60, *,
             every: float = 0.05) -> T:
    """Poll a condition another process makes true, every ``every`` seconds until
    ``limit`` seconds; its value."""
    deadline = time.monotonic() + limit
    found: T | None = None
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise WaitTimedOut(f"timed out after {limit:g} s waiting for {what}; "
                       f"last saw: {_clip(repr(found))}")


def _shown(described: Any) -> str:
    return described if isinstance(described, str) else repr(described)


def _clip(text: str) -> str:
    if len(text) <= _LONGEST:
        return text
    return f"{text[:_LONGEST]}... ({len(text)} characters)"
