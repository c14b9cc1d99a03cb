"""The front door's work queue keeps controller-runtime's promises: a key queued once
however often it is added, never handed to two reconcilers at once, a change during a pass
queued once after it, a per-key backoff that doubles up to its cap and restarts after a
success, the earliest timer of a key wins. Time is a fake scheduler fired by hand: no
test sleeps or measures time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from controlplane.frontdoor.workqueue import ShutDown, WorkQueue


@dataclass
class FakeTimer:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    def when(self) -> float:
        return self.at


@dataclass
class FakeScheduler:
    now: float = 0.0
    timers: list[FakeTimer] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[float]:
        return sorted(t.at - self.now for t in self.timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if not t.cancelled and t.at <= self.now]
        self.timers = [t for t in self.timers if t not in due]
        for timer in sorted(due, key=lambda t: t.at):
            timer.callback()


def queue(scheduler: FakeScheduler | None = None) -> WorkQueue[str]:
    return WorkQueue(base_delay=1.0, max_delay=8.0, scheduler=scheduler or FakeScheduler())


def drain(q: WorkQueue[str]) -> list[str]:
    """Every key queued now, each taken and done."""
    taken = []
    while len(q):
        key = q.get_nowait()
        taken.append(key)
        q.done(key)
    return taken


async def test_a_key_added_twice_while_waiting_is_handed_out_once() -> None:
    q = queue()
    for key in ("a", "b", "a", "a"):
        q.add(key)
    assert drain(q) == ["a", "b"]


async def test_a_key_added_during_its_pass_is_queued_once_after_it() -> None:
    q = queue()
    q.add("a")
    key = await q.get()
    q.add("a")
    q.add("a")
    assert len(q) == 0, "not handed out while its pass runs"
    q.done(key)
    assert drain(q) == ["a"]
    assert drain(q) == []


async def test_two_reconcilers_never_hold_one_key_at_once() -> None:
    q = queue()
    holding: set[str] = set()
    passes: list[str] = []
    release = asyncio.Event()

    async def reconciler() -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            assert key not in holding
            holding.add(key)
            passes.append(key)
            await release.wait()
            holding.discard(key)
            q.done(key)

    tasks = [asyncio.create_task(reconciler()) for _ in range(3)]
    q.add("a")
    q.add("b")
    for _ in range(5):
        await asyncio.sleep(0)  # let the reconcilers take what they can
    q.add("a")  # a change while "a" is held: queued, not handed to the idle third
    for _ in range(5):
        await asyncio.sleep(0)
    assert sorted(holding) == ["a", "b"]
    release.set()
    for _ in range(10):  # "b" and "a" done, then "a" again
        await asyncio.sleep(0)
    q.shut_down()
    await asyncio.gather(*tasks)
    assert sorted(passes) == ["a", "a", "b"]


async def test_failures_back_off_exponentially_up_to_the_cap_and_success_forgets() -> None:
    clock = FakeScheduler()
    q = queue(clock)
    delays = []
    for _ in range(6):
        delays.append(q.add_rate_limited("a"))
        clock.advance(delays[-1])
        assert drain(q) == ["a"]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert q.add_rate_limited("b") == 1.0, "each key backs off on its own"
    q.forget("a")
    assert q.add_rate_limited("a") == 1.0


async def test_a_key_waits_for_its_timer_and_the_earliest_timer_wins() -> None:
    clock = FakeScheduler()
    q = queue(clock)
    q.add_after("a", 5.0)
    q.add_after("a", 2.0)
    q.add_after("a", 9.0)
    assert clock.pending() == [2.0]
    assert q.scheduled("a")
    clock.advance(1.9)
    assert drain(q) == []
    clock.advance(0.1)
    assert not q.scheduled("a")
    assert drain(q) == ["a"]


async def test_a_dropped_key_loses_its_timer_and_its_backoff() -> None:
    clock = FakeScheduler()
    q = queue(clock)
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    q.drop("a")
    assert clock.pending() == []
    assert q.failures("a") == 0
    clock.advance(10)
    assert drain(q) == []


async def test_after_shut_down_nothing_is_handed_out() -> None:
    clock = FakeScheduler()
    q = queue(clock)
    q.add_after("a", 1.0)
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.shut_down()
    with pytest.raises(ShutDown):
        await waiting
    assert clock.pending() == []
    q.add("b")
    assert len(q) == 0
