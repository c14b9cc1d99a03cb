"""Deliver pod-change wakes to the engine without ever stalling the watch.

The pod cache calls :meth:`WakeDispatcher.notify` with a pod UID for every change it
sees (both UIDs when a pod is replaced under the same name). The dispatcher coalesces
them (a UID already pending is not queued twice) and one task calls the engine's
``on_pod_change(uid)``, or ``on_pod_changes(uids)`` with every UID pending (up to
:data:`BATCH`) — e.g. a closure over ``store.leases.wake_by_keys``: one transaction for a
burst of changes instead of one each (the scale benchmark's bottleneck) — awaiting it if
it is a coroutine. A failing callback (the database is restarting, say) is logged and the
UID is delivered again after a backoff (``retry_delays``); after the last one it is
dropped, and the machines it would have woken still wake at their own ``wake_at``
deadlines. A newer change of the same pod is still coalesced with a pending retry.

Called by :mod:`drivers.kube.driver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import Callable

from controlplane.logs import get_logger

log = get_logger("drivers.kube.wakes")

#: ``on_pod_change(uid)``: may be plain or ``async``.
PodChangeCallback = Callable[[str], object]
#: ``on_pod_changes(uids)``: every UID pending at once (up to a batch), plain or ``async``.
PodChangesCallback = Callable[[list[str]], object]
#: Most UIDs handed to a batch callback at once.
BATCH = 256


class WakeDispatcher:
    """UIDs in, callback calls out: coalesced, in order, off the watch's path."""

    def __init__(self, callback: PodChangeCallback | None = None,
                 retry_delays: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0), *,
                 batch_callback: PodChangesCallback | None = None) -> None:
        if (callback is None) == (batch_callback is None):
            raise ValueError("give exactly one of callback and batch_callback")
        self._callback = callback
        self._batch_callback = batch_callback
        self._retry_delays = retry_delays
        self._attempts: dict[str, int] = {}  # uid -> failed deliveries so far
        self._order: deque[str] = deque()
        self._pending: set[str] = set()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failed = 0

    def notify(self, uid: str) -> None:
        if uid and uid not in self._pending:
            self._pending.add(uid)
            self._order.append(uid)
            self._ready.set()

    @property
    def idle(self) -> bool:
        return not self._pending

    @property
    def retrying(self) -> int:
        """UIDs whose delivery failed and will be tried again."""
        return len(self._attempts)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pod-wakes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._order:
                uids = [self._order.popleft()
                        for _ in range(min(len(self._order),
                                           1 if self._batch_callback is None else BATCH))]
                self._pending.difference_update(uids)
                try:
                    if self._batch_callback is not None:
                        result = self._batch_callback(uids)
                    else:
                        assert self._callback is not None
                        result = self._callback(uids[0])
                    if inspect.isawaitable(result):
                        await result
                    self.delivered += len(uids)
                    for uid in uids:
                        self._attempts.pop(uid, None)
                except Exception as exc:  # the engine's trouble must not kill the wakes
                    self.failed += len(uids)
                    self._retry_later(uids, exc)

    def _retry_later(self, uids: list[str], exc: Exception) -> None:
        """Deliver ``uids`` again after their backoff; drop those out of retries."""
        by_delay: dict[float, list[str]] = {}
        dropped = 0
        for uid in uids:
            attempt = self._attempts.get(uid, 0)
            if attempt >= len(self._retry_delays):
                self._attempts.pop(uid, None)
                dropped += 1
                continue
            self._attempts[uid] = attempt + 1
            by_delay.setdefault(self._retry_delays[attempt], []).append(uid)
        loop = asyncio.get_running_loop()
        for delay, again in by_delay.items():
            loop.call_later(delay, self._notify_all, again)
        log.warning("pod wakes failed", error=repr(exc), uids=len(uids),
                    retrying=sum(map(len, by_delay.values())), dropped=dropped)

    def _notify_all(self, uids: list[str]) -> None:
        for uid in uids:
            self.notify(uid)
