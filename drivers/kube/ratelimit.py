"""The client-side rate limit: a token bucket of ``qps`` tokens a second, ``burst`` deep.

Every API request (watch starts included) takes one token first, so a control plane of
many machines cannot flood the API server (client-go's ``--kube-api-qps/burst``).
:meth:`TokenBucket.acquire` *reserves* a token at once — possibly going into debt — and
then sleeps exactly until that token is due, so concurrent callers are served in
arrival order without a lock or a polling loop. The clock and the sleep are injected:
tests pass a fake pair and check the rate without ever sleeping.

Called by :class:`~drivers.kube.client.KubeClient`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Monotonic = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class TokenBucket:
    """At most ``burst`` requests at once, then ``qps`` a second on average."""

    def __init__(self, *, qps: float, burst: int, clock: Monotonic = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        if burst < 1 and qps > 0:
            raise ValueError("burst must be at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = clock()
        self.waited_seconds = 0.0  # total time callers spent waiting for tokens

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0

    def reserve(self) -> float:
        """Take one token now; returns how long the caller must wait before using it."""
        if self.unlimited:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> float:
        """Wait for a token; returns the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            try:
                await self._sleep(wait)
            except asyncio.CancelledError:
                self._tokens += 1.0  # give the unused token back
                raise
            self.waited_seconds += wait
        return wait
