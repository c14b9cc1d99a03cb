"""A watch-backed cache of one resource (client-go's reflector + store, in one class).

:class:`WatchCache` LISTs (page by page), then WATCHes from the list's
``resourceVersion`` with ``allowWatchBookmarks``, and keeps every object by key
(``namespace/name``, or ``name``) with an index by ``metadata.uid``:

- each event moves the cache's ``resource_version``; a bookmark moves only that, so a
  reconnect resumes where the stream stopped and never replays old history;
- a watch the server ends (its ``timeoutSeconds``) or that drops is resumed from the last
  version; errors back off exponentially (``backoff_initial`` .. ``backoff_max``);
- ``410 Gone``/``Expired`` (an ``ERROR`` event or the HTTP status) means the history is
  compacted: RELIST at once and diff against the cache;
- every ``resync_seconds`` it relists and diffs too (a belt-and-braces repair of anything
  a watch might have missed — not client-go's replay-to-handlers, which would wake every
  machine for nothing);
- every change, from a watch event or a relist diff, calls ``on_change(old, new)``.

The cache is :attr:`synced` once a list succeeded and while the watch is healthy; after
a watch error or a 410, until a watch or list succeeds again, it is not, and readers
must not trust an absence (the observer then reads through; see
:mod:`drivers.kube.observer`). :attr:`last_error` keeps the failure it is recovering
from; :meth:`wait_synced` gives up at once, raising it, when the FIRST list is refused
for a reason no retry fixes (unreachable server, 401, 403: see :data:`FATAL_AT_START`).
Called by :mod:`drivers.kube.driver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from controlplane.logs import get_logger
from drivers.kube.client import KubeObject
from drivers.kube.config import KubeSettings
from drivers.kube.errors import (
    ApiForbidden,
    ApiGone,
    ApiUnauthorized,
    ApiUnreachable,
    KubeApiError,
    from_status,
)
from drivers.kube.ratelimit import Monotonic, Sleep
from drivers.kube.resources import CoreV1, Kind

log = get_logger("drivers.kube.cache")

ChangeHook = Callable[[KubeObject | None, KubeObject | None], None]

#: Failures of the first list that end :meth:`WatchCache.wait_synced` at once. A
#: control plane started against a wrong address or without RBAC should say so now,
#: not after ``sync_timeout``; once synced, the same failures are retried with backoff
#: (an API server restart must not take the driver down).
FATAL_AT_START: tuple[type[KubeApiError], ...] = (ApiUnreachable, ApiUnauthorized,
                                                   ApiForbidden)


def object_key(obj: KubeObject) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _uid(obj: KubeObject | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _version(obj: KubeObject | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


@dataclass
class CacheStats:
    lists: int = 0  # successful LISTs, the first included
    relists: int = 0  # of which after a 410 or for a resync
    watches: int = 0  # watch streams opened
    events: int = 0  # ADDED / MODIFIED / DELETED applied
    bookmarks: int = 0
    expired: int = 0  # 410s seen
    errors: int = 0  # other failures (each followed by a backoff)


class WatchCache:
    """One resource kept current by list + watch; read it with :meth:`get`."""

    def __init__(self, api: CoreV1, kind: Kind, *, settings: KubeSettings,
                 namespace: str | None = None, label_selector: str | None = None,
                 on_change: ChangeHook | None = None, clock: Monotonic = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.settings = settings
        self.on_change = on_change
        self.stats = CacheStats()
        self.resource_version = ""
        self.last_error: KubeApiError | None = None  # what it is recovering from, if anything
        self._objects: dict[str, KubeObject] = {}
        self._by_uid: dict[str, str] = {}
        self._listed = False
        self._healthy = False
        self._clock = clock
        self._sleep = sleep
        self._pulse = asyncio.Event()  # set (and replaced) on every change or sync
        self._task: asyncio.Task[None] | None = None

    # --- reading -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Listed at least once and the watch is healthy: an absence can be trusted."""
        return self._listed and self._healthy

    def covers(self, namespace: str | None) -> bool:
        """Whether objects of ``namespace`` are in scope of this cache."""
        return self.namespace is None or namespace == self.namespace

    def get(self, key: str) -> KubeObject | None:
        return self._objects.get(key)

    def get_by_uid(self, uid: str) -> KubeObject | None:
        key = self._by_uid.get(uid)
        return None if key is None else self._objects.get(key)

    def __iter__(self) -> Iterator[KubeObject]:
        return iter(list(self._objects.values()))

    def __len__(self) -> int:
        return len(self._objects)

    async def wait_until(self, check: Callable[[], bool], *, limit_seconds: float,
                         what: str = "condition") -> None:
        """Wait until ``check()`` holds, re-checked on every change (never polls)."""
        try:
            async with asyncio.timeout(limit_seconds):
                while not check():
                    await self._pulse.wait()
        except TimeoutError:
            raise TimeoutError(f"{self.kind.plural} cache: {what} not reached within "
                               f"{limit_seconds}s") from None

    async def wait_synced(self, *, limit_seconds: float) -> None:
        """Until synced; raises the first list's failure at once if it is fatal."""
        def done() -> bool:
            return self.synced or self._fatal() is not None
        try:
            await self.wait_until(done, limit_seconds=limit_seconds, what="first sync")
        except TimeoutError as exc:
            if self.last_error is not None:
                raise TimeoutError(f"{exc}; last error: {self.last_error}") from self.last_error
            raise
        fatal = self._fatal()
        if fatal is not None and not self.synced:
            raise fatal

    def _fatal(self) -> KubeApiError | None:
        error = self.last_error
        return error if not self._listed and isinstance(error, FATAL_AT_START) else None

    # --- running -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"watch-cache-{self.kind.plural}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._healthy = False

    async def _run(self) -> None:
        s = self.settings
        backoff = s.backoff_initial
        need_list = True
        listed_at = self._clock()
        while True:
            try:
                due = s.resync_seconds > 0 and self._clock() - listed_at >= s.resync_seconds
                if need_list or due:
                    await self._list(relist=self._listed)
                    listed_at, need_list = self._clock(), False
                timeout = s.watch_timeout
                if s.resync_seconds > 0:
                    timeout = min(timeout, s.resync_seconds - (self._clock() - listed_at))
                await self._watch(max(1, int(timeout)))
                backoff = s.backoff_initial
            except ApiGone as exc:
                self.stats.expired += 1
                self.last_error = exc
                self._set_health(False)
                need_list = True
                log.info("watch expired, relisting", resource=self.kind.plural, error=str(exc))
            except KubeApiError as exc:
                self.stats.errors += 1
                self.last_error = exc
                self._set_health(False, force_pulse=True)
                log.warning("watch cache error, backing off", resource=self.kind.plural,
                            error=str(exc), backoff=backoff)
                await self._sleep(backoff)
                backoff = min(backoff * 2, s.backoff_max)
            except Exception as exc:
                # Not an API failure (a malformed object, a bug): never leave a dead loop
                # behind a cache that still says it is synced. Start over from a list.
                self.stats.errors += 1
                self._set_health(False)
                need_list = True
                log.error("watch cache failed unexpectedly, relisting",
                          resource=self.kind.plural, error=repr(exc), backoff=backoff)
                await self._sleep(backoff)
                backoff = min(backoff * 2, s.backoff_max)

    async def _list(self, *, relist: bool) -> None:
        items, version = await self.api.list_all(
            self.kind, namespace=self.namespace, label_selector=self.label_selector,
            page_size=self.settings.list_page_size)
        fresh = {object_key(o): o for o in items}
        before = self._objects
        self._objects = fresh
        self._by_uid = {_uid(o): k for k, o in fresh.items() if _uid(o)}
        self.resource_version = version
        self.stats.lists += 1
        self.stats.relists += relist
        self._listed = True
        self.last_error = None
        self._set_health(True)
        for key in sorted(before.keys() | fresh.keys()):
            old, new = before.get(key), fresh.get(key)
            if old is None or new is None or _version(old) != _version(new) or \
                    _uid(old) != _uid(new):
                self._notify(old, new)

    async def _watch(self, timeout_seconds: int) -> None:
        async with self.api.watch(self.kind, namespace=self.namespace,
                                  resource_version=self.resource_version,
                                  label_selector=self.label_selector,
                                  timeout_seconds=timeout_seconds, bookmarks=True) as events:
            self.stats.watches += 1
            self._healthy = True
            self.last_error = None
            self._pulse_now()
            async for event in events:
                self._apply(event)

    def _apply(self, event: KubeObject) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            raise from_status(int(obj.get("code") or 500), obj, verb="watch",
                              path=self.kind.plural, resource=self.kind.plural,
                              namespace=self.namespace)
        version = _version(obj)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            self.resource_version = version or self.resource_version
            self._pulse_now()
            return
        key = object_key(obj)
        old = self._objects.get(key)
        if kind == "DELETED" and old is not None and _uid(obj) and _uid(old) != _uid(obj):
            # The deletion of an object the cache already saw replaced (after a relist):
            # keep the newcomer, but still report the deleted one.
            self.resource_version = version or self.resource_version
            self._notify(obj, None)
            return
        if old is not None and self._by_uid.get(_uid(old)) == key:
            del self._by_uid[_uid(old)]
        new: KubeObject | None = None
        if kind in ("ADDED", "MODIFIED"):
            new = self._objects[key] = obj
            if _uid(obj):
                self._by_uid[_uid(obj)] = key
        elif kind == "DELETED":
            self._objects.pop(key, None)
        else:
            return
        self.stats.events += 1
        self.resource_version = version or self.resource_version
        self._notify(old, new)

    def _notify(self, old: KubeObject | None, new: KubeObject | None) -> None:
        self._pulse_now()
        if self.on_change is None:
            return
        try:
            self.on_change(old, new)
        except Exception as exc:  # a hook's bug must not stop the cache
            log.error("watch cache hook failed", resource=self.kind.plural, error=repr(exc))

    def _set_health(self, healthy: bool, *, force_pulse: bool = False) -> None:
        # force_pulse: a failure is news to wait_synced even when health did not change.
        if healthy != self._healthy or force_pulse:
            self._healthy = healthy
            self._pulse_now()

    def _pulse_now(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()
