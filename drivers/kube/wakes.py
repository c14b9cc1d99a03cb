"""Deliver pod-change wakes to the engine without ever stalling the watch.

The pod cache calls :meth:`WakeDispatcher.notify` with a pod UID for every change it
sees (both UIDs when a pod is replaced under the same name). The dispatcher coalesces
them (a UID already pending is not queued twice) and one task calls the engine's
``on_pod_change(uid)`` — e.g. a closure over ``store.leases.wake_by_key`` — awaiting it if
it is a coroutine. A failing callback is logged and the UID dropped: the machines it
would have woken still wake at their own ``wake_at`` deadlines.

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


class WakeDispatcher:
    """UIDs in, callback calls out: coalesced, in order, off the watch's path."""

    def __init__(self, callback: PodChangeCallback) -> None:
        self._callback = callback
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
                uid = self._order.popleft()
                self._pending.discard(uid)
                try:
                    result = self._callback(uid)
                    if inspect.isawaitable(result):
                        await result
                    self.delivered += 1
                except Exception as exc:  # the engine's trouble must not kill the wakes
                    self.failed += 1
                    log.warning("pod wake failed", uid=uid, error=repr(exc))
