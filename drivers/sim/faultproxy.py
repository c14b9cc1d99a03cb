"""The simulator's fault hooks in front of a real API server: a fault-injecting proxy.

:class:`FaultProxy` listens on plain HTTP on loopback and forwards every request to an
upstream API server (URL, CA and bearer token, or a kubeconfig holding them) after the
same :class:`~drivers.sim.faults.Faults` rules the simulator applies: the request is
named as the simulator's server names it (``parse_path``, ``verb_of``), delayed and/or
refused with the simulator's ``Status`` (``error_response``), else relayed (method, path,
query, body, ``Content-Type``, ``Accept``, the client's ``Authorization`` or the upstream
token). Paths the simulator does not serve go through untouched. Watches are relayed
line by line (:class:`ProxiedWatches`), so drops, cuts and ``ERROR 410`` reach them
after any event. ``compact`` compacts the real etcd (:class:`EtcdHistory`) and then
answers a watch from an older version itself, with the 410 the real server gives once
that version has left its watch cache: right after a compaction kube-apiserver still
replays it from that cache (pinned in ``tests/drivers/test_fault_proxy.py``).
``send_bookmarks`` returns 0: a real server bookmarks when it chooses. A 403 names the
sender as the real server knows them (a ``SelfSubjectReview`` of the token; the token
itself, as the simulator names users, if that fails).
Called by the driver contract tests (``tests/drivers/harness.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

from drivers.sim.faults import Clock, Faults, History, Request
from drivers.sim.objects import ApiError
from drivers.sim.server import error_response, parse_path, verb_of
from drivers.sim.watch import stream_error

#: Before Python 3.12.8 a TLS connection closed while its peer still streams (a watch the
#: proxy lets go) can wait on the TLS shutdown past the event loop's end and leak its
#: socket (CPython gh-118960); aiohttp then aborts what it closed when the session closes.
#: Later versions fixed it, and aiohttp warns when asked there.
SSL_CLOSE_LEAKS = sys.version_info < (3, 12, 8)

#: Headers a client's request keeps on its way upstream (hop-by-hop and encodings stay).
_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept", "User-Agent")
#: Headers of the upstream answer that do not describe the body as relayed here.
_DROPPED = {"content-length", "content-encoding", "transfer-encoding", "connection",
            "keep-alive", "date", "server"}
_LINE_LIMIT = 4 << 20  # one watch event (an object with 256 KiB of annotations fits)


class EtcdHistory:
    """The real change history: etcd, through its v3 gRPC gateway over plain HTTP.

    :meth:`compact` reads the current revision (``/v3/kv/range``) and compacts at it
    (``/v3/kv/compaction``, physical), so a watch resumed from an older
    ``resourceVersion`` meets what the real server makes of that. Synchronous, like the
    simulator's: a test compacts between two awaits, with nothing served in between.
    """

    def __init__(self, endpoint: str, *, timeout: float = 10.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout

    def revision(self) -> int:
        answer = self._post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        return int(answer["header"]["revision"])

    def compact(self) -> int:
        revision = self.revision()
        try:
            self._post("/v3/kv/compaction", {"revision": revision, "physical": True})
        except urllib.error.HTTPError as exc:  # compacted there already: nothing to do
            with exc:  # it holds the response and its socket
                if b"compacted" not in exc.read():
                    raise
        return revision

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.endpoint}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer


class NoHistory:
    """A proxy whose etcd is out of reach (a cluster given only by kubeconfig)."""

    def compact(self) -> int:
        raise NotImplementedError("compact() needs the etcd behind the API server: "
                                  "pass history=EtcdHistory(...) to FaultProxy")


class _Compactions:
    """The proxy's history: compacts the real one and remembers at which revision."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.revision = 0

    def compact(self) -> int:
        self.revision = self.history.compact()
        return self.revision

    def expired(self, resource_version: str) -> ApiError | None:
        """The 410 for a watch from before the last compaction, in the watch cache's
        words (``too old resource version: 75 (90)``: 90 is the oldest it resumes from)."""
        if not (resource_version.isascii() and resource_version.isdigit()):
            return None  # "" or "0": from now; not a number: the real server says so
        if 0 < int(resource_version) < self.revision:
            return ApiError(410, f"too old resource version: {resource_version} "
                                 f"({self.revision})", reason="Expired")
        return None


@dataclass(frozen=True)
class _Signal:
    kind: str  # "drop", "cut", "expire", "eof" (upstream ended)


@dataclass(eq=False)  # identity: streams live in a set
class _Stream:
    queue: asyncio.Queue[bytes | _Signal] = field(default_factory=asyncio.Queue)


class ProxiedWatches:
    """Every watch stream the proxy is relaying: the :class:`~drivers.sim.faults.Watches`
    of a :class:`Faults` in front of a real server."""

    def __init__(self) -> None:
        self.streams: set[_Stream] = set()
        self.interrupt: Callable[[], str | None] = lambda: None

    def drop(self, *, abrupt: bool = False) -> int:
        return self._signal(_Signal("cut" if abrupt else "drop"))

    def expire(self) -> int:
        return self._signal(_Signal("expire"))

    def send_bookmarks(self) -> int:
        """Not possible: a real server sends a bookmark when it chooses (about once a
        minute, and before a ``timeoutSeconds`` close), never on request."""
        return 0

    def _signal(self, signal: _Signal) -> int:
        for stream in self.streams:
            stream.queue.put_nowait(signal)
        return len(self.streams)


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class FaultProxy:
    """A fault-injecting reverse proxy on ``127.0.0.1`` in front of one API server."""

    def __init__(self, upstream: str, *, ca_file: str | Path | None = None,
                 ca_data: bytes | None = None, token: str | None = None,
                 verify: bool = True, history: History | None = None, seed: int = 0,
                 clock: Clock = time.monotonic, request_timeout: float = 60.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token
        self.watches = ProxiedWatches()
        self.history = _Compactions(history or NoHistory())
        self.faults = Faults(self.history, self.watches, seed=seed, clock=clock)
        self.request_timeout = request_timeout
        self._ssl: ssl.SSLContext | bool = False if not verify else ssl.create_default_context(
            cafile=str(ca_file) if ca_file else None,
            cadata=ca_data.decode() if ca_data else None)
        self._users: dict[str, str] = {}  # Authorization header -> user name
        self._closing = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @classmethod
    def from_kubeconfig(cls, path: str | Path, *, context: str | None = None,
                        **options: Any) -> FaultProxy:
        """A proxy to the server of ``path``'s context (its CA and bearer token)."""
        doc = yaml.safe_load(Path(path).read_text())
        name = context or doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        token = user.get("token")
        if token is None and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        ca_file = cluster.get("certificate-authority")
        if ca_file:
            ca_file = Path(path).parent / ca_file
        data = cluster.get("certificate-authority-data")
        return cls(str(cluster["server"]), ca_file=ca_file,
                   ca_data=base64.b64decode(data) if data else None, token=token,
                   verify=not cluster.get("insecure-skip-tls-verify", False), **options)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, *, token: str | None = None,
                         namespace: str | None = None) -> Path:
        """A kubeconfig pointing at the proxy (the bearer token is relayed upstream)."""
        context: dict[str, str] = {"cluster": "faultproxy", "user": "faultproxy"}
        if namespace:
            context["namespace"] = namespace
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "faultproxy",
               "clusters": [{"name": "faultproxy", "cluster": {"server": self.url}}],
               "users": [{"name": "faultproxy", "user": {"token": token or self.token or ""}}],
               "contexts": [{"name": "faultproxy", "context": context}]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc))
        return path

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl,
                                           enable_cleanup_closed=SSL_CLOSE_LEAKS),
            read_bufsize=_LINE_LIMIT, auto_decompress=False)
        app = web.Application(client_max_size=16 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        self._closing.set()
        self.watches.drop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # --- relaying ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.method == "GET" and \
            request.query.get("watch", "").lower() in ("1", "true")
        path = request.path
        if path.startswith("/api/v1/"):
            try:
                target = parse_path(path[len("/api/v1/"):])
            except ApiError:
                target = None  # not a path the simulator serves: the real server judges
            if target is not None:
                verb = verb_of(request.method, target, watch)
                user = await self._user(request) if self._names_users() else None
                hit = self.faults.take(Request(verb, target.resource.plural, target.namespace,
                                               target.name, user))
                if hit.delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._closing.wait(), hit.delay)
                if hit.error is not None:
                    return error_response(hit.error)
        if self._closing.is_set():  # stopping (a delay was cut short): nothing goes out
            return error_response(ApiError(503, "fault proxy: shutting down"))
        if watch:
            return await self._relay_watch(request)
        return await self._relay(request)

    def _upstream_request(self, request: web.Request) -> tuple[URL, dict[str, str]]:
        headers = {k: request.headers[k] for k in _REQUEST_HEADERS if k in request.headers}
        headers["Accept-Encoding"] = "identity"  # relayed as is, and watches split by line
        if "Authorization" not in headers and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return URL(self.upstream + request.raw_path, encoded=True), headers

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        url, headers = self._upstream_request(request)
        body = await request.read()
        try:
            async with self._session.request(
                    request.method, url, headers=headers, data=body or None,
                    timeout=aiohttp.ClientTimeout(total=self.request_timeout)) as answer:
                data = await answer.read()
                return web.Response(status=answer.status, body=data,
                                    headers=_answer_headers(answer))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response(ApiError(503, f"fault proxy: upstream {self.upstream} "
                                                 f"failed: {type(exc).__name__}: {exc}"))

    async def _relay_watch(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        expired = self.history.expired(request.query.get("resourceVersion", ""))
        if expired is not None:
            return await stream_error(request, expired)
        url, headers = self._upstream_request(request)
        try:
            answer = await self._session.get(
                url, headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response(ApiError(503, f"fault proxy: upstream {self.upstream} "
                                                 f"failed: {type(exc).__name__}: {exc}"))
        if answer.status != 200:  # refused before it started: relayed like any answer
            async with answer:
                return web.Response(status=answer.status, body=await answer.read(),
                                    headers=_answer_headers(answer))
        stream = _Stream()
        pump = asyncio.create_task(_pump(answer, stream))
        self.watches.streams.add(stream)
        try:
            response = web.StreamResponse(status=200, headers=_answer_headers(answer))
            response.enable_chunked_encoding()
            await response.prepare(request)
            try:
                outcome = await self._relay_events(response, stream)
                if outcome == "cut":
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client went away: nothing left to tell it
            return response
        finally:
            self.watches.streams.discard(stream)
            pump.cancel()
            _abort(answer)

    async def _relay_events(self, response: web.StreamResponse, stream: _Stream) -> str:
        """Relay lines until the upstream ends or a fault does; "end" or "cut"."""
        while True:
            item = await stream.queue.get()
            if isinstance(item, _Signal):
                if item.kind == "expire":
                    expired = ApiError(410, "too old resource version", reason="Expired")
                    await response.write(_line({"type": "ERROR", "object": expired.status()}))
                return "cut" if item.kind == "cut" else "end"
            await response.write(item)
            if item.strip():
                stop = self.watches.interrupt()
                if stop is not None:
                    return "cut" if stop == "cut" else "end"

    # --- who is asking -----------------------------------------------------------------

    def _names_users(self) -> bool:
        """Only a 403 says who was refused: ask who the sender is only when one may come."""
        return any(rule.code == 403 for rule in self.faults.rules)

    async def _user(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization") or (
            f"Bearer {self.token}" if self.token else "")
        if not auth:
            return None
        if auth not in self._users:
            self._users[auth] = await self._review(auth) or auth.removeprefix("Bearer ")
        return self._users[auth]

    async def _review(self, auth: str) -> str | None:
        """The user name the upstream gives this credential (``SelfSubjectReview``)."""
        assert self._session is not None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with self._session.post(
                    f"{self.upstream}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                    json=body, headers={"Authorization": auth},
                    timeout=aiohttp.ClientTimeout(total=self.request_timeout)) as answer:
                if answer.status == 201:
                    review = await answer.json()
                    name = ((review.get("status") or {}).get("userInfo") or {}).get("username")
                    return str(name) if name else None
        return None


async def _pump(answer: aiohttp.ClientResponse, stream: _Stream) -> None:
    """Upstream watch lines into the stream's queue, then ``eof`` (ended or broken)."""
    try:
        while line := await answer.content.readline():
            stream.queue.put_nowait(line)
    except (aiohttp.ClientError, ValueError):
        pass
    stream.queue.put_nowait(_Signal("eof"))


def _abort(answer: aiohttp.ClientResponse) -> None:
    """Close an upstream stream at once. A TLS close mid-stream would wait (30 s) for a
    close_notify the server, busy streaming, never sends, and outlive the event loop."""
    connection = answer.connection
    if connection is not None and connection.transport is not None:
        connection.transport.abort()
    answer.close()


def _answer_headers(answer: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED}
