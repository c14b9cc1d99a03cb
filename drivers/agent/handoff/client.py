"""The target side of a handoff: fetch an offered checkpoint from the source node's agent
straight into local files, verified, and acknowledge it.

:func:`fetch_checkpoint` is called by the target node's agent before it restores; on
:class:`~drivers.agent.handoff.errors.HandoffFailed` it pulls the registry copy instead.
Nothing it leaves behind is unverified: archives are written as ``.partial`` files, named
only once the stream's FINAL record and every digest check out, and removed on any
failure. Wire format: :mod:`~drivers.agent.handoff.frames`; the other side:
:mod:`~drivers.agent.handoff.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import aiohttp

from controlplane.logs import get_logger
from drivers.agent.handoff import frames
from drivers.agent.handoff.errors import HandoffFailed, HandoffInterrupted, HandoffRefused
from drivers.agent.handoff.frames import Head, Kind
from drivers.registry.checkpoints import Archive

log = get_logger("drivers.agent.handoff")
READ_BUFFER = 4 * frames.CHUNK  # the response buffer aiohttp fills before it pauses reading
Progress = Callable[[int, int], None]  # (plain bytes arrived, of total)


@dataclass(frozen=True)
class ReceivedArchive:
    container: str
    path: Path
    size: int
    digest: str  # ``sha256:...`` of the bytes received: the source's archive file
    image: str = ""
    media_type: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    diff_id: str = ""

    def archive(self) -> Archive:
        """As the restore and the registry push take it."""
        return Archive(self.container, self.path, self.image, media_type=self.media_type,
                       annotations=self.annotations, diff_id=self.diff_id,
                       digest=self.digest)


@dataclass(frozen=True)
class Received:
    checkpoint_id: str
    source_uid: str  # as the source stated it
    archives: tuple[ReceivedArchive, ...]
    size: int  # plain bytes
    seconds: float  # from the request to the last byte verified
    acknowledged: bool  # the source took the acknowledgement (its ``delivered``)
    format: str = ""  # the source dumper's archive format, as its HEAD stated it

    @property
    def paths(self) -> dict[str, Path]:
        return {a.container: a.path for a in self.archives}


class _Sink:
    """The archives written and hashed as records arrive, in a thread of its own (one:
    records are opened in order). Every method but ``__init__`` runs in that thread."""

    def __init__(self, dest: Path, head: Head, opener: frames.Opener) -> None:
        self._dest, self._head, self._opener = dest, head, opener
        self._made_dest = False
        self._partials: list[Path] = []
        self._finals: list[Path] = []
        self._files: list[Any] = []
        self._hashes = [sha256() for _ in head.entries]
        self._left = [e.size for e in head.entries]
        self._index = 0

    def _failed(self, exc: OSError) -> HandoffFailed:
        return HandoffFailed(f"the checkpoint cannot be written under {self._dest}: "
                             f"{exc.strerror or exc}",
                             hint="check the agent's work directory (space, permissions)")

    def open(self) -> None:
        try:
            self._open()
        except OSError as exc:
            raise self._failed(exc) from exc

    def _open(self) -> None:
        try:
            self._dest.mkdir(mode=0o700, parents=True)
            self._made_dest = True
        except FileExistsError:
            if not self._dest.is_dir() or any(self._dest.iterdir()):
                raise HandoffFailed(f"{self._dest} exists and is not an empty directory",
                                    hint="give each fetch a fresh directory") from None
        os.chmod(self._dest, 0o700)  # whatever the umask: the archive is process memory
        for entry in self._head.entries:
            final = self._dest / f"{entry.container}.tar"
            partial = final.with_name(final.name + ".partial")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._partials.append(partial)
            self._finals.append(final)
            self._files.append(open(fd, "wb", buffering=0))  # noqa: SIM115

    def data(self, header: bytes, body: bytes) -> None:
        _, plain = self._opener.open(header, body)
        while self._index < len(self._left) and not self._left[self._index]:
            self._index += 1
        if self._index == len(self._left) or len(plain) > self._left[self._index]:
            raise HandoffInterrupted("the source sent more bytes than its HEAD announced: "
                                     "the stream is corrupt")
        view, out = memoryview(plain), self._files[self._index]
        try:
            while view:
                view = view[out.write(view):]
        except OSError as exc:
            raise self._failed(exc) from exc
        self._hashes[self._index].update(plain)
        self._left[self._index] -= len(plain)

    def finish(self, stated: list[bytes]) -> list[ReceivedArchive]:
        if any(self._left):
            raise HandoffInterrupted(f"the stream ended {sum(self._left)} bytes short of what "
                                     "its HEAD announced")
        for entry, mine, theirs in zip(self._head.entries, self._hashes, stated, strict=True):
            if mine.digest() != theirs:
                raise HandoffInterrupted(
                    f"container {entry.container}'s archive arrived as sha256:"
                    f"{mine.hexdigest()}, the source read sha256:{theirs.hex()}")
        try:
            self._close()
            for partial, final in zip(self._partials, self._finals, strict=True):
                os.replace(partial, final)
        except OSError as exc:
            raise self._failed(exc) from exc
        return [ReceivedArchive(e.container, path, e.size, f"sha256:{h.hexdigest()}", e.image,
                                e.media_type, e.annotations, e.diff_id)
                for e, path, h in zip(self._head.entries, self._finals, self._hashes,
                                      strict=True)]

    def _close(self) -> None:
        for out in self._files:
            out.close()
        self._files.clear()

    def discard(self) -> None:
        self._close()
        for path in (*self._partials, *self._finals):
            path.unlink(missing_ok=True)
        if self._made_dest:
            self._dest.rmdir()


def _forget(job: asyncio.Future[Any] | None) -> None:
    """A job given up on: cancelled, or its error marked seen (it was reported another
    way)."""
    if job is not None:
        if not job.done():
            job.cancel()
        elif not job.cancelled():
            job.exception()


def _refused(status: int, text: str, address: str) -> HandoffFailed:
    said = f"the source agent at {address} answered {status}: {text.strip()[:500]}"
    if status == 401:
        return HandoffRefused(said, status=status, hint=(
            "mount the same handoff key Secret (--handoff-key) into both agents, and keep the "
            "nodes' clocks within 60 s of each other"))
    if status == 403:
        return HandoffRefused(said, status=status, hint=(
            "only the migration's target node may fetch it"))
    if status in (404, 410):
        return HandoffRefused(said, status=status, hint="restore from the registry copy")
    if status in (409, 503):
        return HandoffInterrupted(said, status=status, hint="retry shortly")
    if status == 500:
        return HandoffRefused(said, status=status, hint=(
            "see the source agent's log; restore from the registry copy"))
    return HandoffInterrupted(said, status=status, hint="is the address a handoff server?")


class _Fetch:
    """One fetch's state: its phase (for messages), its progress, its sink and the job in
    the sink's thread."""

    def __init__(self, address: str, checkpoint_id: str, target_node: str, dest: Path,
                 progress: Progress | None) -> None:
        self.address, self.checkpoint_id, self.target_node = address, checkpoint_id, target_node
        self.dest, self.progress = dest, progress
        self.phase = f"connecting to the source agent at {address}"
        self.arrived = self.total = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="handoff-receive")
        self.sink: _Sink | None = None
        self.pending: asyncio.Future[None] | None = None

    async def connected(self, *_: object) -> None:  # an aiohttp trace hook
        self.phase = (f"waiting for the source agent at {self.address} to offer checkpoint "
                      f"{self.checkpoint_id} (its dump may still be running)")

    def _run(self, job: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return asyncio.wrap_future(self.pool.submit(job, *args))

    async def receive(self, content: aiohttp.StreamReader, opener: frames.Opener
                      ) -> tuple[Head, list[ReceivedArchive]]:
        """The stream after its prefix, record by record, into the sink."""
        self.phase = f"receiving checkpoint {self.checkpoint_id} from {self.address}"
        header = await content.readexactly(frames.HEADER.size)
        _, length = frames.parse_header(header)
        _, plain = opener.open(header, await content.readexactly(length))
        head = frames.decode_head(plain)
        if (head.checkpoint_id, head.target_node) != (self.checkpoint_id, self.target_node):
            raise HandoffFailed(f"the source sent checkpoint {head.checkpoint_id} for "
                                f"{head.target_node}")
        self.total = head.total
        self.sink = _Sink(self.dest, head, opener)
        await self._run(self.sink.open)
        while True:
            header = await content.readexactly(frames.HEADER.size)
            kind, length = frames.parse_header(header)
            body = await content.readexactly(length)
            if self.pending is not None:
                await self.pending
                self.pending = None
            if kind is Kind.DATA:  # opened, written and hashed while the next one arrives
                self.pending = self._run(self.sink.data, header, body)
                self.arrived += length - frames.TAG_BYTES
                if self.progress is not None:
                    self.progress(self.arrived, self.total)
                continue
            kind, plain = opener.open(header, body)  # in order: no job is pending
            if kind is Kind.ABORT:
                raise HandoffRefused(f"the source agent at {self.address} stopped streaming "
                                     f"checkpoint {self.checkpoint_id}: "
                                     f"{plain.decode(errors='replace')}",
                                     hint="restore from the registry copy")
            break  # FINAL: the opener refuses a second HEAD
        digests = frames.decode_final(plain, len(head.entries))
        if await content.read(1):
            raise HandoffInterrupted("bytes follow the stream's FINAL record")
        return head, await self._run(self.sink.finish, digests)

    @contextlib.contextmanager
    def errors_named(self, timeout: float) -> Iterator[None]:
        """Transport errors as ``HandoffInterrupted`` naming the phase they ended."""
        try:
            yield
        except TimeoutError:
            got = f" ({self.arrived} of {self.total} bytes)" if self.total else ""
            raise HandoffInterrupted(
                f"fetching checkpoint {self.checkpoint_id} timed out after {timeout:g} s, "
                f"while {self.phase}{got}",
                hint="raise the handoff timeout, or restore from the registry copy") from None
        except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError) as exc:
            raise HandoffInterrupted(
                f"the stream of checkpoint {self.checkpoint_id} from {self.address} broke "
                f"after {self.arrived} of {self.total} bytes, before its FINAL record: the "
                "source agent stopped or the connection was cut",
                hint="retry, or restore from the registry copy") from exc
        except aiohttp.ClientConnectorError as exc:
            raise HandoffInterrupted(
                f"{self.phase}: {exc.os_error.strerror or exc.os_error}",
                hint="is the source agent's handoff server up, and reachable from this node "
                "(pod network, NetworkPolicy)?") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise HandoffInterrupted(f"{self.phase}: {type(exc).__name__}: {exc}",
                                     hint="is the address the source agent's handoff "
                                     "server?") from exc

    async def discard(self) -> None:
        """Nothing left behind: the sink's files go once the job in its thread ends."""
        _forget(self.pending)
        if self.sink is not None:
            with contextlib.suppress(OSError):
                await asyncio.shield(self._run(self.sink.discard))


# ``timeout`` is a parameter, not the caller's asyncio.timeout: it also tells the source how
# long it may hold the request for the offer, and names the phase that ran out.
async def fetch_checkpoint(address: str, checkpoint_id: str, *, key: bytes, target_node: str,
                           dest: Path, timeout: float,  # noqa: ASYNC109
                           wait: float | None = None,
                           connect_timeout: float = 5.0, ack_timeout: float = 5.0,
                           progress: Progress | None = None,
                           now: Callable[[], float] = time.time) -> Received:
    """Stream checkpoint ``checkpoint_id`` from the source agent at ``address``
    (``host:port``) into ``dest`` (created 0700; files 0600), as node ``target_node``.

    ``timeout`` bounds the whole fetch; ``wait`` (default: ``timeout``) how long the
    source may hold the request until the checkpoint is offered. ``progress(arrived,
    total)`` is called as records arrive. Raises ``HandoffFailed`` (``HandoffRefused`` or
    ``HandoffInterrupted``) with the reason, leaving no file behind."""
    frames.check_name(checkpoint_id, what="the checkpoint id")
    mac_key = frames.request_key(key)
    path = frames.PATH + checkpoint_id
    url = f"http://{address}{path}"
    nonce = os.urandom(frames.NONCE_BYTES).hex()
    headers = frames.sign_request(mac_key, method="GET", path=path, node=target_node,
                                  timestamp=int(now()), nonce=nonce,
                                  wait=timeout if wait is None else wait)
    started = asyncio.get_running_loop().time()
    fetch = _Fetch(address, checkpoint_id, target_node, dest, progress)
    tracing = aiohttp.TraceConfig()
    tracing.on_connection_create_end.append(fetch.connected)
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
                read_bufsize=READ_BUFFER, auto_decompress=False,
                trace_configs=[tracing]) as session:
            with fetch.errors_named(timeout):
                async with asyncio.timeout(timeout), session.get(url, headers=headers) as got:
                    if got.status != 200:
                        text = (await got.content.read(2048)).decode(errors="replace")
                        raise _refused(got.status, text, address)
                    salt = frames.read_prefix(await got.content.readexactly(
                        len(frames.MAGIC) + frames.SALT_BYTES))
                    head, received = await fetch.receive(got.content, frames.Opener(
                        frames.stream_key(key, salt, checkpoint_id=checkpoint_id,
                                          target_node=target_node, request_nonce=nonce)))
            seconds = asyncio.get_running_loop().time() - started
            acknowledged = await _acknowledge(session, url, mac_key, checkpoint_id,
                                              target_node, salt.hex(), ack_timeout, now)
    except BaseException:
        await fetch.discard()
        raise
    finally:
        fetch.pool.shutdown(wait=False)
    log.info("checkpoint received", checkpoint=checkpoint_id, source=address,
             bytes=head.total, seconds=round(seconds, 3), acknowledged=acknowledged)
    return Received(checkpoint_id, head.source_uid, tuple(received), head.total, seconds,
                    acknowledged, head.format)


async def _acknowledge(session: aiohttp.ClientSession, url: str, mac_key: bytes,
                       checkpoint_id: str, node: str, transfer: str, within: float,
                       now: Callable[[], float]) -> bool:
    """Tell the source the stream arrived whole; a failure is logged, not raised: the
    archives are here and verified, and the source falls back on its own deadline."""
    path = frames.PATH + checkpoint_id + "/delivered"
    headers = frames.sign_request(mac_key, method="POST", path=path, node=node,
                                  timestamp=int(now()),
                                  nonce=os.urandom(frames.NONCE_BYTES).hex(),
                                  transfer=transfer)
    try:
        async with asyncio.timeout(within), session.post(url + "/delivered",
                                                          headers=headers) as response:
            if response.status == 204:
                return True
            text = (await response.content.read(2048)).decode(errors="replace")
            log.warning("handoff acknowledgement refused", checkpoint=checkpoint_id,
                        status=response.status, reason=text)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.warning("handoff acknowledgement failed", checkpoint=checkpoint_id,
                    error=f"{type(exc).__name__}: {exc}")
    return False
