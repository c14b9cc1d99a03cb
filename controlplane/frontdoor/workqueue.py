"""A rate-limited work queue of keys, with controller-runtime's (client-go's) semantics.

The front door's reconcilers take keys from it (:mod:`controlplane.frontdoor.door`):

- **dedup**: a key added while it waits is queued once;
- **one at a time**: a key taken by :meth:`WorkQueue.get` is not handed out again until
  :meth:`WorkQueue.done`; added meanwhile, it is marked dirty and queued once, after;
- **later**: :meth:`WorkQueue.add_after` queues a key in ``seconds``, or sooner if it is
  already due sooner (one timer a key, the earliest);
- **backoff per key**: :meth:`WorkQueue.add_rate_limited` delays the key by
  ``base * 2**failures`` (capped at ``cap``); :meth:`WorkQueue.forget` resets the count
  once a pass succeeds.

Pure asyncio, no driver. Timers go through an injectable :class:`Scheduler` (the running
event loop by default), so tests fire them by hand instead of sleeping.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class Timer(Protocol):
    def cancel(self) -> None: ...

    def when(self) -> float: ...


class Scheduler(Protocol):
    """Time and timers: what ``asyncio``'s event loop offers."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class ShutDown(Exception):
    """The queue was shut down: :meth:`WorkQueue.get` hands out nothing more."""


class WorkQueue(Generic[K]):
    """Keys to process (see the module docstring)."""

    def __init__(self, *, base_delay: float, max_delay: float,
                 scheduler: Scheduler | None = None) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._scheduler = scheduler
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # queued, or to be queued once its pass is done
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, Timer] = {}
        self._ready = asyncio.Event()  # set while the queue may hold a key
        self._shut = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shut(self) -> bool:
        return self._shut

    # -- adding -----------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it is queued already; if it is being processed, queue it
        once that pass is done."""
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wake()

    def add_after(self, key: K, seconds: float) -> None:
        """Queue ``key`` in ``seconds``, unless a timer already queues it sooner."""
        if self._shut:
            return
        if seconds <= 0:
            self.add(key)
            return
        scheduler = self._scheduler or asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= scheduler.time() + seconds:
                return
            timer.cancel()

        def fire() -> None:
            if self._timers.get(key) is new:
                del self._timers[key]
                self.add(key)
        new = self._timers[key] = scheduler.call_later(seconds, fire)

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its backoff (doubling with each failure since the last
        :meth:`forget`, up to ``max_delay``); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * 2.0 ** min(failures, 62), self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key's pass succeeded: its next failure backs off from ``base_delay``."""
        self._failures.pop(key, None)

    def drop(self, key: K) -> None:
        """The key is gone: forget its backoff and cancel its timer (a queued key is still
        handed out once; the caller finds nothing to do for it)."""
        self.forget(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def scheduled(self, key: K) -> bool:
        """Whether a timer will queue ``key`` (a retry, a wait, a deferred write)."""
        return key in self._timers

    # -- taking -----------------------------------------------------------------------

    async def get(self) -> K:
        """The next key, marked as being processed until :meth:`done`."""
        while not self._queue or self._shut:
            if self._shut:
                raise ShutDown
            self._ready.clear()
            await self._ready.wait()
        return self.get_nowait()

    def get_nowait(self) -> K:
        """:meth:`get` when :func:`len` says a key waits (``IndexError`` if none does)."""
        if self._shut:
            raise ShutDown
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """The pass over ``key`` is over; if it was added meanwhile, queue it now."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut:
            self._queue.append(key)
            self._wake()

    def shut_down(self) -> None:
        """Cancel every timer; :meth:`get` raises :class:`ShutDown` from now on."""
        self._shut = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wake()

    def _wake(self) -> None:
        self._ready.set()
