"""Pod wakes reach the engine coalesced, in order, and survive a failing callback."""

from __future__ import annotations

import asyncio

from drivers.kube.wakes import WakeDispatcher


async def test_wakes_are_coalesced_awaited_and_survive_failures() -> None:
    delivered: list[str] = []
    done = asyncio.Event()

    async def wake(uid: str) -> None:
        if uid == "bad":
            raise RuntimeError("database down")
        delivered.append(uid)
        if uid == "last":
            done.set()

    wakes = WakeDispatcher(wake, retry_delays=())
    for uid in ("a", "b", "a", "bad", "", "last"):
        wakes.notify(uid)
    wakes.start()
    try:
        async with asyncio.timeout(5):
            await done.wait()
    finally:
        await wakes.stop()
    assert delivered == ["a", "b", "last"]
    assert (wakes.delivered, wakes.failed) == (3, 1)
    assert wakes.idle


async def test_a_wake_that_fails_while_the_database_is_down_is_delivered_later() -> None:
    """The database restarting must not lose a pod's wake: it is retried with backoff."""
    down = 2  # the first two deliveries fail
    delivered = asyncio.Event()
    calls: list[str] = []

    async def wake(uid: str) -> None:
        nonlocal down
        calls.append(uid)
        if down:
            down -= 1
            raise ConnectionError("database unavailable")
        delivered.set()

    wakes = WakeDispatcher(wake, retry_delays=(0.0, 0.0, 0.0))
    wakes.notify("pod-uid")
    wakes.start()
    try:
        async with asyncio.timeout(5):
            await delivered.wait()
    finally:
        await wakes.stop()
    assert calls == ["pod-uid"] * 3
    assert (wakes.delivered, wakes.failed) == (1, 2)


async def test_a_wake_is_dropped_after_its_last_retry() -> None:
    calls: list[str] = []
    gave_up = asyncio.Event()

    async def wake(uid: str) -> None:
        calls.append(uid)
        if len(calls) == 3:
            gave_up.set()
        raise ConnectionError("still down")

    wakes = WakeDispatcher(wake, retry_delays=(0.0, 0.0))
    wakes.notify("pod-uid")
    wakes.start()
    try:
        async with asyncio.timeout(5):
            await gave_up.wait()  # the third call raised right after: handled already
        assert (wakes.retrying, wakes.idle) == (0, True)  # given up: nothing scheduled
    finally:
        await wakes.stop()
    assert calls == ["pod-uid"] * 3  # the first try and two retries
    assert wakes.failed == 3


async def test_a_burst_of_changes_reaches_a_batch_callback_in_one_call() -> None:
    batches: list[list[str]] = []
    done = asyncio.Event()

    async def wake_many(uids: list[str]) -> None:
        batches.append(uids)
        done.set()

    wakes = WakeDispatcher(batch_callback=wake_many)
    for uid in ("a", "b", "a", "c", ""):
        wakes.notify(uid)
    wakes.start()
    try:
        async with asyncio.timeout(5):
            await done.wait()
    finally:
        await wakes.stop()
    assert batches == [["a", "b", "c"]]  # coalesced, in order, one call
    assert (wakes.delivered, wakes.failed) == (3, 0)
