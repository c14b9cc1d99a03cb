"""The source side of a handoff: the source agent's HTTP server that streams a dumped
checkpoint, sealed, to the one node it is offered to.

The source agent opens one :class:`HandoffServer`; for each migration it offers the
archives it dumped to the target node (:meth:`HandoffServer.offer`) and awaits
:meth:`Offer.delivered` (the target verified the stream to its end and acknowledged it),
or withdraws the offer with a reason. A request that comes before the offer (the target
asks while the source still dumps) is held until the offer, a withdrawal or the end of
its wait. Wire format and signatures: :mod:`~drivers.agent.handoff.frames`; the other
side: :mod:`~drivers.agent.handoff.client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from hashlib import sha256
from types import TracebackType
from typing import Any

from aiohttp import web

from controlplane.logs import get_logger
from drivers.agent.handoff import frames
from drivers.agent.handoff.errors import HandoffRefused
from drivers.agent.handoff.frames import CHUNK, Kind, SignedRequest
from drivers.registry.checkpoints import Archive

log = get_logger("drivers.agent.handoff")
REMEMBERED = 1024  # withdrawal reasons kept for late requests
STOPPED = "the source agent's handoff server stopped"
Record = tuple[bytes, bytes]


@dataclass(frozen=True)
class Delivery:
    """A stream the target verified to its end and acknowledged."""

    checkpoint_id: str
    target_node: str
    transfer: str  # the stream's salt, hex
    size: int  # plain bytes
    digests: tuple[str, ...]  # ``sha256:...`` of each archive, in order
    seconds: float  # from the stream's start to its acknowledgement


@dataclass(frozen=True)
class _Sent:
    size: int
    digests: tuple[str, ...]
    started: float  # loop time


class Offer:
    """A checkpoint made available to one node, until withdrawn."""

    def __init__(self, checkpoint_id: str, archives: Sequence[Archive], *, source_uid: str,
                 target_node: str, format: str = "") -> None:
        self.checkpoint_id, self.archives = checkpoint_id, tuple(archives)
        self.source_uid, self.target_node, self.format = source_uid, target_node, format
        self.streaming = False  # a fetch holds it: another is refused (409)
        self.withdrawn: str | None = None  # the reason
        self._settled = asyncio.Event()
        self._delivery: Delivery | None = None
        self._sent: dict[str, _Sent] = {}  # transfer -> what its FINAL stated

    @property
    def is_delivered(self) -> bool:
        return self._delivery is not None

    @property
    def may_have_reached_target(self) -> bool:
        """The target may hold the whole checkpoint, and run it: a stream's FINAL went out
        (acknowledged or not) or a stream is under way (its FINAL may still go out)."""
        return self.is_delivered or bool(self._sent) or self.streaming

    async def delivered(self) -> Delivery:
        """Once the target acknowledged a whole stream; ``HandoffRefused`` with the reason
        if the offer is withdrawn first. Bound it with the caller's own timeout."""
        await self._settled.wait()
        if self._delivery is None:
            raise HandoffRefused(f"checkpoint {self.checkpoint_id} was withdrawn before "
                                 f"{self.target_node} had it: {self.withdrawn}")
        return self._delivery

    def _withdraw(self, reason: str) -> None:
        self.withdrawn = reason
        self._settled.set()

    def _acknowledged(self, delivery: Delivery) -> None:
        if self._delivery is None:
            self._delivery = delivery
            self._settled.set()


def _refusal(kind: type[web.HTTPException], reason: str, **fields: Any) -> web.HTTPException:
    log.warning("handoff request refused", status=kind.status_code, reason=reason, **fields)
    return kind(text=reason)


class _Reader:
    """The archives read, hashed and sealed record by record, in a thread of its own
    (hashlib and the file reads release the GIL: they run beside the socket writes)."""

    def __init__(self, archives: Sequence[Archive], sizes: Sequence[int],
                 sealer: frames.Sealer) -> None:
        self._archives, self._sizes, self._sealer = archives, sizes, sealer
        self._index, self._left = -1, 0
        self._file: Any = None
        self._hash = sha256()
        self._buffer = memoryview(bytearray(CHUNK))
        self.digests: list[bytes] = []

    def _next_archive(self) -> bool:
        if self._index >= 0:
            self.close()
            self.digests.append(self._hash.digest())
        self._index += 1
        if self._index == len(self._archives):
            return False
        self._hash, self._left = sha256(), self._sizes[self._index]
        self._file = open(self._archives[self._index].path, "rb", buffering=0)  # noqa: SIM115
        os.posix_fadvise(self._file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return True

    def next(self) -> Record | None:
        """The next DATA record, or ``None`` once every archive was read."""
        while self._left == 0:
            if not self._next_archive():
                return None
        want = min(CHUNK, self._left)
        data = self._buffer[:want]  # reused: the record's body is a new buffer
        got = 0
        while got < want:  # a regular file reads short only at its end
            more = self._file.readinto(data[got:])
            if not more:
                archive, size = self._archives[self._index], self._sizes[self._index]
                raise OSError(f"archive of container {archive.container} ended after "
                              f"{size - self._left + got} of {size} bytes: it changed while "
                              "streaming")
            got += more
        self._hash.update(data)
        self._left -= want
        return self._sealer.seal(Kind.DATA, data)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _sizes(archives: Sequence[Archive]) -> list[int]:
    return [os.stat(archive.path).st_size for archive in archives]


class HandoffServer:
    """Serves offered checkpoints to their target nodes (an async context manager)."""

    def __init__(self, key: bytes, host: str = "127.0.0.1", port: int = 0, *,
                 default_wait: float = 30.0, max_wait: float = 600.0,
                 window: float = frames.WINDOW, shutdown_timeout: float = 2.0,
                 now: Callable[[], float] = time.time) -> None:
        self._key, self._mac_key = key, frames.request_key(key)
        self.host, self._port = host, port
        self.default_wait, self.max_wait, self.window = default_wait, max_wait, window
        self._shutdown_timeout, self._now = shutdown_timeout, now
        self._offers: dict[str, Offer] = {}
        self._withdrawn: OrderedDict[str, str] = OrderedDict()
        self._waiting: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._replays = frames.ReplayGuard(window=window)
        self._runner: web.AppRunner | None = None
        self._stopping = False

    @property
    def port(self) -> int:
        """The port listened on (chosen by the system when 0 was asked for)."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (``[v6]:port`` for IPv6)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self._port}"

    async def __aenter__(self) -> HandoffServer:
        app = web.Application()
        app.router.add_get(frames.PATH + "{checkpoint_id}", self._fetch)
        app.router.add_post(frames.PATH + "{checkpoint_id}/delivered", self._acknowledge)
        # A request whose asker hung up is cancelled at once: held for an offer, it would
        # otherwise claim that offer when it comes and turn the asker's retry away (409).
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=self._shutdown_timeout,
                                     handler_cancellation=True)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self._port).start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self._port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        # Held requests and streams end now, with a reason, not at the shutdown timeout.
        self._stopping = True
        for checkpoint_id in list(self._offers):
            self.withdraw(checkpoint_id, STOPPED)
        self._notify()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the source agent's side -----------------------------------------------------------

    def offer(self, checkpoint_id: str, archives: Sequence[Archive], *, source_uid: str,
              target_node: str, format: str = "") -> Offer:
        """Make ``archives`` (dumped, complete) available to ``target_node`` only;
        ``format`` (the dumper's) travels in the stream's HEAD."""
        frames.check_name(checkpoint_id, what="the checkpoint id")
        frames.check_name(target_node, what="the target node")
        names = [frames.check_name(a.container, what="the container") for a in archives]
        if len(set(names)) != len(names):
            raise ValueError(f"checkpoint {checkpoint_id} names a container twice: {names}")
        if checkpoint_id in self._offers:
            raise ValueError(f"checkpoint {checkpoint_id} is offered already; withdraw it "
                             "first")
        offer = Offer(checkpoint_id, archives, source_uid=source_uid, target_node=target_node,
                      format=format)
        self._withdrawn.pop(checkpoint_id, None)
        self._offers[checkpoint_id] = offer
        log.info("checkpoint offered", checkpoint=checkpoint_id, target_node=target_node,
                 archives=len(names))
        self._notify()
        return offer

    def withdraw(self, checkpoint_id: str, reason: str) -> None:
        """End the offer (offered or not yet): requests waiting for it, streaming it, or
        coming later are refused with ``reason``."""
        self._withdrawn[checkpoint_id] = reason
        self._withdrawn.move_to_end(checkpoint_id)
        while len(self._withdrawn) > REMEMBERED:
            self._withdrawn.popitem(last=False)
        offer = self._offers.pop(checkpoint_id, None)
        if offer is not None:
            offer._withdraw(reason)
        self._notify()

    def waiting(self, checkpoint_id: str) -> int:
        """Requests held for this checkpoint's offer now."""
        return self._waiting[checkpoint_id]

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- HTTP ------------------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> SignedRequest:
        now = self._now()
        try:
            signed = frames.verify_request(self._mac_key, method=request.method,
                                           path=request.path, headers=request.headers,
                                           now=now, window=self.window)
            self._replays.admit(signed, now=now)
        except frames.NotAuthentic as exc:
            raise _refusal(web.HTTPUnauthorized, f"authentication failed: {exc}",
                           peer=request.remote) from None
        except frames.TooManyNonces as exc:
            raise _refusal(web.HTTPServiceUnavailable, str(exc), peer=request.remote) from None
        return signed

    async def _offer_for(self, checkpoint_id: str, wait: float) -> Offer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        self._waiting[checkpoint_id] += 1
        try:
            while True:
                reason = self._withdrawn.get(checkpoint_id)
                if reason is not None:
                    raise _refusal(web.HTTPGone, f"checkpoint {checkpoint_id} was withdrawn "
                                   f"by the source agent: {reason}")
                offer = self._offers.get(checkpoint_id)
                if offer is not None:
                    return offer
                if self._stopping:
                    raise _refusal(web.HTTPGone, f"checkpoint {checkpoint_id}: {STOPPED}")
                if loop.time() >= deadline:
                    raise _refusal(web.HTTPNotFound, f"checkpoint {checkpoint_id} was not "
                                   f"offered on this node within {wait:g} s: its dump has "
                                   "not finished, or this is not its source node")
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        await changed.wait()
        finally:
            self._waiting[checkpoint_id] -= 1
            if not self._waiting[checkpoint_id]:
                del self._waiting[checkpoint_id]

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        signed = self._authenticate(request)
        checkpoint_id = request.match_info["checkpoint_id"]
        wait = self.default_wait if signed.wait is None else min(signed.wait, self.max_wait)
        offer = await self._offer_for(checkpoint_id, wait)
        if offer.target_node != signed.node:
            raise _refusal(web.HTTPForbidden, f"checkpoint {checkpoint_id} is offered to node "
                           f"{offer.target_node}, not to {signed.node}", peer=request.remote)
        if offer.streaming:
            raise _refusal(web.HTTPConflict, f"checkpoint {checkpoint_id} is streaming to "
                           f"{signed.node} already: one fetch at a time (retry once that one "
                           "ends)")
        offer.streaming = True
        try:
            return await self._stream(request, offer, signed)
        finally:
            offer.streaming = False

    async def _stream(self, request: web.Request, offer: Offer,
                      signed: SignedRequest) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        try:
            sizes = await asyncio.to_thread(_sizes, offer.archives)
        except OSError as exc:
            raise _refusal(web.HTTPInternalServerError, f"the source agent cannot read "
                           f"checkpoint {offer.checkpoint_id}'s archives: {exc}") from exc
        salt = os.urandom(frames.SALT_BYTES)
        sealer = frames.Sealer(frames.stream_key(
            self._key, salt, checkpoint_id=offer.checkpoint_id, target_node=signed.node,
            request_nonce=signed.nonce))
        head = frames.Head(offer.checkpoint_id, offer.source_uid, offer.target_node, tuple(
            frames.Entry(a.container, size, a.image, a.media_type, dict(a.annotations),
                         a.diff_id) for a, size in zip(offer.archives, sizes, strict=True)),
            offer.format)
        response = web.StreamResponse(headers={"Content-Type": frames.MEDIA_TYPE,
                                               "Cache-Control": "no-store"})
        await response.prepare(request)
        started = loop.time()
        reader = _Reader(offer.archives, sizes, sealer)
        # One thread per stream: records are sealed in order, and the reader's file is
        # closed by the same thread once its last read is done.
        pool = ThreadPoolExecutor(1, thread_name_prefix="handoff-send")
        ending, finished = "", False
        try:
            for part in (frames.prefix(salt), *sealer.seal(Kind.HEAD, frames.encode_head(head))):
                await response.write(part)
            pending: asyncio.Future[Record | None] | None = loop.run_in_executor(
                pool, reader.next)
            while pending is not None:
                try:
                    record = await pending
                except OSError as exc:
                    ending = f"the source agent could not read the checkpoint: {exc}"
                    break
                if record is None:
                    break
                # Read the next record while this one is sent; not after a withdrawal.
                pending = loop.run_in_executor(pool, reader.next) \
                    if offer.withdrawn is None else None
                for part in record:
                    await response.write(part)
                if pending is None:
                    ending = f"the source agent withdrew it: {offer.withdrawn}"
            if ending:
                log.warning("handoff aborted", checkpoint=offer.checkpoint_id, reason=ending)
                for part in sealer.seal(Kind.ABORT, ending.encode()[:4096]):
                    await response.write(part)
            else:
                # Known before FINAL goes out: its acknowledgement may arrive before
                # this write returns.
                offer._sent[salt.hex()] = _Sent(
                    head.total, tuple(f"sha256:{d.hex()}" for d in reader.digests), started)
                for part in sealer.seal(Kind.FINAL, frames.encode_final(reader.digests)):
                    await response.write(part)
            await response.write_eof()
            finished = True
        except ConnectionError:
            pass  # the target went away (logged below): it may retry
        finally:
            pool.submit(reader.close)
            pool.shutdown(wait=False)
            if not finished:  # also when cancelled: the target hung up
                log.warning("handoff stream broken off", checkpoint=offer.checkpoint_id,
                            target_node=signed.node)
        return response

    async def _acknowledge(self, request: web.Request) -> web.StreamResponse:
        signed = self._authenticate(request)
        checkpoint_id = request.match_info["checkpoint_id"]
        offer = self._offers.get(checkpoint_id)
        if offer is None:
            raise _refusal(web.HTTPGone, f"checkpoint {checkpoint_id} is not offered (any "
                           "more)")
        if offer.target_node != signed.node:
            raise _refusal(web.HTTPForbidden, f"checkpoint {checkpoint_id} is offered to node "
                           f"{offer.target_node}, not to {signed.node}", peer=request.remote)
        sent = offer._sent.get(signed.transfer)
        if sent is None:
            raise _refusal(web.HTTPConflict, f"no complete stream {signed.transfer[:16]} of "
                           f"checkpoint {checkpoint_id} to acknowledge")
        delivery = Delivery(checkpoint_id, signed.node, signed.transfer, sent.size,
                            sent.digests, asyncio.get_running_loop().time() - sent.started)
        offer._acknowledged(delivery)
        log.info("checkpoint handed off", checkpoint=checkpoint_id, target_node=signed.node,
                 bytes=delivery.size, seconds=round(delivery.seconds, 3))
        return web.Response(status=204)
