"""The client-side rate limit caps the request rate — proven on a fake clock, never slept.

Invariants pinned: in any window of ``w`` seconds at most ``burst + qps * w`` requests
start; waiting callers are served in arrival order; an idle bucket refills to ``burst``
and no further; a cancelled wait gives its token back; every KubeClient request (watch
starts included) takes a token.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from drivers.kube.client import KubeClient
from drivers.kube.config import load_configuration
from drivers.kube.metrics import RequestCounter
from drivers.kube.ratelimit import TokenBucket
from drivers.kube.resources import PODS, CoreV1
from drivers.sim import SimCluster


class FakeTime:
    """A monotonic clock whose ``sleep`` moves time instead of waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def _max_in_window(stamps: list[float], window: float) -> int:
    return max(sum(1 for t in stamps if start <= t < start + window - 1e-9) for start in stamps)


async def test_sequential_requests_are_held_to_qps_after_the_burst() -> None:
    fake = FakeTime()
    bucket = TokenBucket(qps=5, burst=3, clock=fake.clock, sleep=fake.sleep)
    stamps = []
    for _ in range(23):
        await bucket.acquire()
        stamps.append(fake.now)
    assert fake.now - 1000.0 == pytest.approx((23 - 3) / 5)
    for window in (0.5, 1.0, 2.0):
        assert _max_in_window(stamps, window) <= 3 + 5 * window
    assert bucket.waited_seconds == pytest.approx(4.0)


def test_concurrent_callers_reserve_tokens_in_arrival_order() -> None:
    fake = FakeTime()
    bucket = TokenBucket(qps=10, burst=2, clock=fake.clock, sleep=fake.sleep)
    waits = [bucket.reserve() for _ in range(6)]
    assert waits == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3, 0.4])


def test_an_idle_bucket_refills_up_to_its_burst_only() -> None:
    fake = FakeTime()
    bucket = TokenBucket(qps=2, burst=4, clock=fake.clock, sleep=fake.sleep)
    assert [bucket.reserve() for _ in range(4)] == [0.0] * 4
    fake.now += 3600
    waits = [bucket.reserve() for _ in range(6)]
    assert waits[:4] == [0.0] * 4
    assert waits[4:] == pytest.approx([0.5, 1.0])


async def test_a_cancelled_wait_gives_its_token_back() -> None:
    fake = FakeTime()
    blocked = asyncio.Event()

    async def never(seconds: float) -> None:
        blocked.set()
        await asyncio.Event().wait()

    bucket = TokenBucket(qps=1, burst=1, clock=fake.clock, sleep=never)
    assert bucket.reserve() == 0.0
    waiter = asyncio.create_task(bucket.acquire())
    await blocked.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.reserve() == pytest.approx(1.0)  # not 2.0: the cancelled token came back


def test_zero_qps_means_unlimited() -> None:
    bucket = TokenBucket(qps=0, burst=1)
    assert bucket.unlimited
    assert all(bucket.reserve() == 0.0 for _ in range(1000))


async def test_every_client_request_takes_a_token(tmp_path: Path) -> None:
    """20 GETs through the client at 5 qps, burst 5: the fake clock advances 3 seconds
    and the server saw every request."""
    fake = FakeTime()
    counter = RequestCounter()
    async with SimCluster(nodes=1) as cluster:
        cluster.create_pod("default", "limited")
        loaded = await load_configuration(
            kubeconfig=str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        client = KubeClient(ApiClient(loaded.configuration), counter=counter,
                            limiter=TokenBucket(qps=5, burst=5, clock=fake.clock,
                                                sleep=fake.sleep))
        try:
            api = CoreV1(client)
            for _ in range(20):
                await api.get(PODS, "limited", namespace="default")
        finally:
            await client.close()
        assert cluster.requests["get"] == 20
    assert fake.now - 1000.0 == pytest.approx(3.0)
    assert counter.snapshot()["get"] == 20
    assert counter.total == 20
