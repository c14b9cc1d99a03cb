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

    wakes = WakeDispatcher(wake)
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
