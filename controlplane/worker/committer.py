"""Group commit: concurrent machines' commits and releases share one transaction.

Each machine task hands its :class:`CommitRequest` (or :class:`ReleaseRequest`) to the
:class:`GroupCommitter` and awaits the outcome. One background task takes everything
queued and writes it with ``store.batch.write_batch`` — one transaction, one fsync —
then takes what queued up meanwhile. There is no timer: a lone request goes out at once,
and batches grow only when the database is the bottleneck. Every machine keeps its own
version and lease guard, so a stale one is refused alone (its task gets the error).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from controlplane.store.batch import write_batch
from controlplane.store.database import Database
from controlplane.store.event_store import CommitRequest
from controlplane.store.leases import ReleaseRequest

Request = CommitRequest | ReleaseRequest


class GroupCommitter:
    def __init__(self, db: Database, *, max_batch: int = 128) -> None:
        self._db = db
        self._max_batch = max_batch
        self._queue: list[tuple[Request, asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.requests = 0

    async def commit(self, request: CommitRequest) -> int:
        """Commit in the next batch; return the new version or raise ``StaleWriter``."""
        version: int = await self._submit(request)
        return version

    async def release(self, request: ReleaseRequest) -> None:
        """Release in the next batch, or raise ``LeaseLost``."""
        await self._submit(request)

    async def _submit(self, request: Request) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        self._ready.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._write(batch)

    async def _write(self, batch: list[tuple[Request, asyncio.Future[Any]]]) -> None:
        commits = [(r, f) for r, f in batch if isinstance(r, CommitRequest)]
        releases = [(r, f) for r, f in batch if isinstance(r, ReleaseRequest)]
        try:
            committed, released = await write_batch(
                self._db, [r for r, _ in commits], [r for r, _ in releases])
        except Exception as exc:  # the whole transaction failed: every member learns why
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self.batches += 1
        self.requests += len(batch)
        outcomes: list[Any] = [*committed, *released]
        for (_, future), outcome in zip([*commits, *releases], outcomes, strict=True):
            if future.done():  # its task was cancelled; the write stands, like a crash
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
