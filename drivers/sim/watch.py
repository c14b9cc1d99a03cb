"""Watches of the simulated API server: change fan-out, bookmarks, 410, streaming.

A :class:`Watch` is one open ``?watch=1`` request. The :class:`WatchHub` subscribes to the
store and offers every change to every open watch, which filters it like the real
server: by resource, namespace and selectors, turning "stopped matching" into
``DELETED`` and "started matching" into ``ADDED``. :func:`stream` writes a watch as
newline-delimited JSON events (``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK``,
``ERROR``):

- ``resourceVersion`` unset or ``"0"``: synthetic ``ADDED`` for every current object, then
  live changes; otherwise the changes after that version, replayed from the history, or
  (like the real server, past authorization) an HTTP 200 whose only event is an
  ``ERROR`` carrying a ``410 Expired`` Status when the history lost them;
- ``allowWatchBookmarks=true``: a ``BOOKMARK`` every ``bookmark_seconds`` and before a
  ``timeoutSeconds`` close, carrying only ``metadata.resourceVersion`` — a version the
  stream has caught up to: every event queued before it is sent first (a bookmark past
  an unsent event would make the client resume after it, and miss it for good);
- fault hooks: :meth:`WatchHub.drop` (end every stream, or cut the connection),
  :meth:`WatchHub.expire` (an ``ERROR 410`` on every stream, then close), and
  :attr:`WatchHub.interrupt`, asked after every event sent whether to end that stream
  (the fault layer's random watch drops; see :mod:`drivers.sim.faults`).

Called by :mod:`drivers.sim.server`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from drivers.sim.objects import ApiError, Obj, Resource, meta
from drivers.sim.selectors import Selector
from drivers.sim.store import Change, Store


@dataclass(frozen=True)
class _Signal:
    kind: str  # "drop", "cut" (drop the connection), "expire"


@dataclass(eq=False)  # identity: watches live in a set
class Watch:
    """One open watch: what it filters on and the queue of events to send."""

    resource: Resource
    namespace: str | None
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[Obj | _Signal] = field(default_factory=asyncio.Queue)

    def offer(self, change: Change) -> None:
        event = self.event_for(change)
        if event is not None:
            self.queue.put_nowait(event)

    def event_for(self, change: Change) -> Obj | None:
        if change.resource != self.resource.plural:
            return None
        if self.namespace is not None and meta(change.obj).get("namespace") != self.namespace:
            return None
        now = change.type != "DELETED" and self.selector.matches(change.obj)
        before = change.prev is not None and self.selector.matches(change.prev)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.obj} if before else None
        if now and before:
            return {"type": "MODIFIED", "object": change.obj}
        if now:
            return {"type": "ADDED", "object": change.obj}
        if before:
            return {"type": "DELETED", "object": change.obj}
        return None


class WatchHub:
    """Every open watch of one server, fed by the store."""

    def __init__(self, store: Store, *, bookmark_seconds: float,
                 clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self.bookmark_seconds = bookmark_seconds
        self.clock = clock  # for watch deadlines; None: the event loop's (tests fake it)
        self.watches: set[Watch] = set()
        # The same watches, by the node a ``spec.nodeName=X`` field selector requires
        # (None: every other watch). A pod change can only match a node-scoped watch of
        # the node the pod is on or was on, so the fan-out offers it to those and to the
        # unscoped watches — not to every node agent's watch (100 at scale).
        self._by_node: dict[str | None, set[Watch]] = {}
        # After each event sent: None to go on, "drop" to end the stream, "cut" to cut it.
        self.interrupt: Callable[[], str | None] = lambda: None
        self._unsubscribe = store.subscribe(self._fan_out)

    def _fan_out(self, change: Change) -> None:
        targets = list(self._by_node.get(None, ()))
        if self._by_node.keys() - {None}:
            nodes = {_node_of(change.obj), _node_of(change.prev)}
            for node in nodes - {None}:
                targets.extend(self._by_node.get(node, ()))
        for watch in targets:
            watch.offer(change)

    def open(self, resource: Resource, namespace: str | None, selector: Selector, *,
             resource_version: str | None, bookmarks: bool,
             initial_events: bool = False) -> Watch:
        """Register a watch and queue its start (synthetic adds or the replayed history).

        ``initial_events`` (``sendInitialEvents=true``, a client's streaming list: what
        ``kubectl wait`` sends): the current objects as ``ADDED``, then a ``BOOKMARK``
        annotated ``k8s.io/initial-events-end: "true"`` (needs ``allowWatchBookmarks``,
        as on a real server: 422 otherwise). Raises a 410 :class:`ApiError` when
        ``resource_version`` was compacted away.
        """
        if initial_events and not bookmarks:
            raise ApiError(422, "ListOptions.meta.k8s.io \"\" is invalid: "
                           "allowWatchBookmarks: Required value: sendInitialEvents requires "
                           "setting allowWatchBookmarks to true")
        watch = Watch(resource, namespace, selector, bookmarks)
        if initial_events or resource_version in (None, "", "0"):
            items, version = self.store.select(resource.plural, namespace, selector)
            for obj in items:
                watch.queue.put_nowait({"type": "ADDED", "object": obj})
            if initial_events:
                end = self.bookmark(resource, version)
                end["object"]["metadata"]["annotations"] = {
                    "k8s.io/initial-events-end": "true"}
                watch.queue.put_nowait(end)
        else:
            since = parse_resource_version(str(resource_version), watch=True)
            for change in self.store.changes_since(since):
                watch.offer(change)
        self.watches.add(watch)
        self._by_node.setdefault(selector.node_name, set()).add(watch)
        return watch

    def close(self, watch: Watch) -> None:
        self.watches.discard(watch)
        scoped = self._by_node.get(watch.selector.node_name)
        if scoped is not None:
            scoped.discard(watch)
            if not scoped:
                del self._by_node[watch.selector.node_name]

    def bookmark(self, resource: Resource, version: int | None = None) -> Obj:
        """A bookmark at ``version`` (default: now). Only for a watch with nothing queued
        up to that version: the client resumes from it."""
        at = self.store.rv if version is None else version
        return {"type": "BOOKMARK", "object": {
            "kind": resource.kind, "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(at)}}}

    def send_bookmarks(self) -> int:
        """Queue a bookmark on every watch that allows them; returns how many."""
        sent = 0
        for watch in list(self.watches):
            if watch.bookmarks:
                watch.queue.put_nowait(self.bookmark(watch.resource))
                sent += 1
        return sent

    def drop(self, *, abrupt: bool = False) -> int:
        """End every open watch (``abrupt``: cut the connection mid-stream)."""
        return self._signal(_Signal("cut" if abrupt else "drop"))

    def expire(self) -> int:
        """Send ``ERROR 410 Expired`` on every open watch, then end it."""
        return self._signal(_Signal("expire"))

    def _signal(self, signal: _Signal) -> int:
        for watch in list(self.watches):
            watch.queue.put_nowait(signal)
        return len(self.watches)

    def shutdown(self) -> None:
        self.drop()
        self._unsubscribe()


def parse_resource_version(value: str, *, watch: bool) -> int:
    """A ``resourceVersion`` parameter as a number, or the real server's refusal: for a
    LIST ``400 BadRequest``; for a watch ``500`` with no reason (kube-apiserver does not
    classify that error), which a client retries with backoff like any 5xx."""
    if value.isascii() and value.isdigit():
        return int(value)
    words = (f'resourceVersion: Invalid value: "{value}": strconv.ParseUint: parsing '
             f'"{value}": invalid syntax')
    if watch:
        raise ApiError(500, words, reason="")
    raise ApiError(400, f"invalid resource version: {words}")


def _node_of(obj: Obj | None) -> str | None:
    node = ((obj or {}).get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _line(event: Obj) -> bytes:
    return orjson.dumps(event) + b"\n"


async def stream_error(request: web.Request, error: ApiError) -> web.StreamResponse:
    """A watch that fails once started (e.g. 410): 200, one ``ERROR`` event, the end."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(_line({"type": "ERROR", "object": error.status()}))
    await response.write_eof()
    return response


async def _send(response: web.StreamResponse, hub: WatchHub, item: Obj | _Signal,
                transform: Callable[[Obj], Obj] | None = None) -> str | None:
    """Write one queued item (an event through ``transform`` when given); then None to go
    on, "end" the stream, or "cut" it."""
    if isinstance(item, _Signal):
        if item.kind == "expire":
            status = ApiError(410, "too old resource version", reason="Expired").status()
            await response.write(_line({"type": "ERROR", "object": status}))
        return "cut" if item.kind == "cut" else "end"
    await response.write(_line(item if transform is None else transform(item)))
    stop = hub.interrupt()
    return "cut" if stop == "cut" else None if stop is None else "end"


async def _close(response: web.StreamResponse, hub: WatchHub, watch: Watch,
                 transform: Callable[[Obj], Obj] | None = None) -> str:
    """At the deadline: send what is queued, then a bookmark no later than that.

    A real API server's closing bookmark follows every event before it on the same stream.
    Bookmarking the store's version while events still sat in the queue (a busy server
    lags its streams) told the client to resume AFTER events it was never sent: the scale
    benchmark's agents lost restore and capture requests until their next resync. What is
    queued now is older than ``version``; what arrives while it is written is newer, and
    the next watch replays it from there.
    """
    version, pending = hub.store.rv, watch.queue.qsize()
    for _ in range(pending):
        outcome = await _send(response, hub, watch.queue.get_nowait(), transform)
        if outcome is not None:
            return outcome
    if watch.bookmarks:
        await response.write(_line(hub.bookmark(watch.resource, version)))
    return "end"


async def stream(request: web.Request, hub: WatchHub, watch: Watch, *,
                 timeout_seconds: float | None,
                 transform: Callable[[Obj], Obj] | None = None) -> web.StreamResponse:
    """Write ``watch`` to the client until its timeout, a signal or a disconnect;
    ``transform``: what each event becomes on the wire (a table row: ``kubectl get -w``)."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    now = hub.clock or asyncio.get_running_loop().time
    deadline = None if timeout_seconds is None else now() + timeout_seconds
    try:
        while True:
            wait = hub.bookmark_seconds if watch.bookmarks else None
            left = None if deadline is None else deadline - now()
            outcome: str | None
            if left is not None and left <= 0:
                outcome = await _close(response, hub, watch, transform)
            else:
                if left is not None:
                    wait = left if wait is None else min(wait, left)
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    # Caught up to the store's version only with nothing queued (wait_for
                    # may time out just as an event arrives: it goes out next, then).
                    if watch.bookmarks and watch.queue.empty() and (
                            deadline is None or deadline > now()):
                        await response.write(_line(hub.bookmark(watch.resource)))
                    continue
                outcome = await _send(response, hub, item, transform)
            if outcome == "cut" and request.transport is not None:
                request.transport.close()
                return response
            if outcome is not None:
                break
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away: nothing left to tell it
    finally:
        hub.close(watch)
    return response
