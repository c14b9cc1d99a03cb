"""HTTP to OCI registries: endpoints, auth challenges, timeouts, retries, typed errors.

:class:`Transport` is the one door to registry hosts (used by
:class:`~drivers.registry.client.RegistryClient`). For each request it:

- picks the endpoint: ``settings.endpoints[host]``, else ``http://host`` for loopback and
  ``settings.plain_http`` hosts, else ``https://host``;
- presents what it holds for (host, scope): a cached bearer token, ``Basic`` credentials
  once the host asked for them, or nothing; on a ``401`` it answers the challenge (see
  :mod:`drivers.registry.auth`) and tries once more;
- bounds the request by a timeout (``request_timeout``, or the caller's, e.g. for blobs);
- retries what is worth retrying (429 honouring ``Retry-After`` up to a cap, 5xx,
  timeouts, refused connections) with exponential backoff, ``attempts`` times in all,
  unless the caller says the request is not repeatable (an upload chunk);
- raises a typed :class:`~drivers.registry.errors.RegistryError` chained from the
  transport error, with the registry's OCI error code and message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from multidict import CIMultiDict

from controlplane.logs import get_logger
from drivers.registry.auth import (
    ANONYMOUS,
    DEFAULT_TOKEN_SECONDS,
    Credentials,
    TokenCache,
    canonical_scope,
    parse_challenge,
)
from drivers.registry.errors import (
    RegistryBadResponse,
    RegistryError,
    RegistryForbidden,
    RegistryTimeout,
    RegistryUnauthorized,
    RegistryUnreachable,
    for_status,
)

log = get_logger("drivers.registry.transport")

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
Sleep = Callable[[float], Awaitable[None]]
Body = bytes | Callable[[], Any] | None  # bytes, or a factory of a fresh aiohttp payload
Sink = Callable[[aiohttp.ClientResponse], Awaitable[None]]


@dataclass(frozen=True)
class RegistrySettings:
    """The HTTP client's knobs; every request is bounded by one of the timeouts."""

    request_timeout: float = 30.0  # a manifest, a HEAD, a delete, a token
    connect_timeout: float = 5.0
    blob_timeout: float = 900.0  # one blob transfer (upload chunk or download)
    attempts: int = 3  # tries of a retryable request, the first included
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    max_retry_after: float = 30.0  # a longer Retry-After is not waited for: fail instead
    chunk_size: int = 8 * 1024 * 1024  # blobs larger than this go up in PATCH chunks
    plain_http: frozenset[str] = frozenset()  # hosts spoken to over http (loopback always)
    endpoints: Mapping[str, str] = field(default_factory=dict)  # host -> base URL override
    credentials: Mapping[str, Credentials] = field(default_factory=dict)  # host -> creds
    manifest_cache: int = 1024  # annotations remembered by digest (manifests are immutable)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise RegistryBadResponse(f"the registry's answer is not JSON: {exc}") from exc


class Transport:
    """Requests to registry hosts with auth, timeouts and retries."""

    def __init__(self, settings: RegistrySettings | None = None, *,
                 sleep: Sleep = asyncio.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or RegistrySettings()
        self.tokens = TokenCache()
        self.sent: Counter[str] = Counter()  # requests by method (retries, tokens included)
        self._basic_hosts: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._sleep = sleep
        self._monotonic = monotonic

    def base_url(self, host: str) -> str:
        override = self.settings.endpoints.get(host)
        if override:
            return override.rstrip("/")
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
        plain = name in LOOPBACK or host in self.settings.plain_http or \
            name in self.settings.plain_http
        return f"{'http' if plain else 'https'}://{host}"

    def credentials(self, host: str) -> Credentials:
        return self.settings.credentials.get(host, ANONYMOUS)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None,
                                              sock_connect=self.settings.connect_timeout),
                auto_decompress=False)
        return self._session

    async def send(self, method: str, host: str, target: str, *, scope: str,
                   headers: Mapping[str, str] | None = None, body: Body = None,
                   params: Mapping[str, str] | None = None, timeout_seconds: float | None = None,
                   repeatable: bool = True, sink: Sink | None = None,
                   ok: tuple[int, ...] = (200,)) -> Reply:
        """One request (retried if ``repeatable``); a :class:`Reply`, or a typed error.

        ``target``: a path (``/v2/...``) or an absolute URL (an upload ``Location``).
        ``sink`` consumes the body of a successful answer (a blob download).
        """
        attempts = max(1, self.settings.attempts) if repeatable else 1
        delay = self.settings.backoff_initial
        for attempt in range(1, attempts + 1):
            try:
                return await self._authorised(method, host, target, scope=scope,
                                              headers=headers, body=body, params=params,
                                              timeout_seconds=timeout_seconds, sink=sink, ok=ok)
            except RegistryError as exc:
                if not exc.retryable or attempt == attempts:
                    raise
                wait = delay
                if exc.retry_after is not None:
                    if exc.retry_after > self.settings.max_retry_after:
                        raise
                    wait = max(wait, exc.retry_after)
                log.info("registry request failed; retrying", method=method, host=host,
                         error=str(exc), attempt=attempt, wait=wait)
                await self._sleep(wait)
                delay = min(delay * 2, self.settings.backoff_max)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _authorised(self, method: str, host: str, target: str, *, scope: str,
                          headers: Mapping[str, str] | None, body: Body,
                          params: Mapping[str, str] | None, timeout_seconds: float | None,
                          sink: Sink | None, ok: tuple[int, ...]) -> Reply:
        answered = False
        while True:
            auth = self._authorization(host, scope)
            sent = dict(headers or {})
            if auth:
                sent["Authorization"] = auth
            status, reply_headers, data = await self._once(
                method, host, target, headers=sent, body=body, params=params,
                timeout_seconds=timeout_seconds, sink=sink, ok=ok)
            if status in ok:
                return Reply(status, reply_headers, data)
            if status == 401 and not answered:
                answered = True
                await self._answer(host, scope, reply_headers.get("WWW-Authenticate", ""))
                continue
            raise self._error(method, target, status, reply_headers, data, presented=auth)

    def _authorization(self, host: str, scope: str) -> str | None:
        creds = self.credentials(host)
        if creds.token:
            return f"Bearer {creds.token}"
        token = self.tokens.get(host, scope, self._monotonic())
        if token:
            return f"Bearer {token}"
        if host in self._basic_hosts:
            return creds.basic
        return None

    async def _answer(self, host: str, scope: str, header: str) -> None:
        challenge = parse_challenge(header)
        creds = self.credentials(host)
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            raise RegistryUnauthorized(f"{host}: 401 with an unusable challenge {header!r}",
                                       status=401)
        if challenge.scheme == "basic":
            if creds.basic is None:
                raise RegistryUnauthorized(f"{host} needs basic credentials and none are "
                                           "configured", status=401,
                                           hint="configure credentials for this registry")
            self._basic_hosts.add(host)
            return
        await self._fetch_token(host, scope, challenge.realm, {
            "service": challenge.params.get("service", ""),
            "scope": canonical_scope(challenge.scope) or scope})

    async def _fetch_token(self, host: str, scope: str, realm: str,
                           query: Mapping[str, str]) -> None:
        if not realm:
            raise RegistryUnauthorized(f"{host}: bearer challenge without a realm", status=401)
        params = {k: v for k, v in query.items() if v}
        url = realm + ("&" if "?" in realm else "?") + urlencode(params)
        basic = self.credentials(host).basic
        status, headers, data = await self._once(
            "GET", host, url, headers={"Authorization": basic} if basic else {}, body=None,
            params=None, timeout_seconds=None, sink=None, ok=(200,))
        if status != 200:
            raise RegistryUnauthorized(f"{host}: the token endpoint {realm} answered {status}"
                                       f" for scope {params.get('scope', '')!r}",
                                       status=status)
        reply = Reply(status, headers, data).json()
        token = reply.get("token") or reply.get("access_token") if isinstance(reply, dict) \
            else None
        if not isinstance(token, str) or not token:
            raise RegistryBadResponse(f"{host}: the token endpoint {realm} sent no token")
        expires = reply.get("expires_in", DEFAULT_TOKEN_SECONDS)
        seconds = float(expires) if isinstance(expires, int | float) else DEFAULT_TOKEN_SECONDS
        self.tokens.put(host, scope, token, seconds, self._monotonic())

    async def _once(self, method: str, host: str, target: str, *, headers: Mapping[str, str],
                    body: Body, params: Mapping[str, str] | None, timeout_seconds: float | None,
                    sink: Sink | None, ok: tuple[int, ...],
                    ) -> tuple[int, Mapping[str, str], bytes]:
        url = target if target.startswith(("http://", "https://")) \
            else self.base_url(host) + target
        limit = timeout_seconds if timeout_seconds is not None else self.settings.request_timeout
        payload = body() if callable(body) else body
        self.sent[method] += 1
        try:
            async with asyncio.timeout(limit), self._client().request(
                    method, url, headers=headers, data=payload, params=params,
                    allow_redirects=True) as response:
                if sink is not None and response.status in ok:
                    await sink(response)
                    return response.status, CIMultiDict(response.headers), b""
                data = await response.read()
                return response.status, CIMultiDict(response.headers), data
        except TimeoutError as exc:
            raise RegistryTimeout(f"{method} {url}: no answer within {limit}s") from exc
        except aiohttp.ClientError as exc:
            raise RegistryUnreachable(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:  # a file body that cannot be read, a refused socket
            raise RegistryUnreachable(f"{method} {url}: {exc}") from exc

    def _error(self, method: str, target: str, status: int, headers: Mapping[str, str],
               data: bytes, *, presented: str | None) -> RegistryError:
        code, message = _oci_error(data)
        cls = for_status(status)
        if status == 401 and presented is not None:
            challenge = parse_challenge(headers.get("WWW-Authenticate", ""))
            if challenge is not None and challenge.insufficient_scope:
                cls = RegistryForbidden
        retry_after = _seconds(headers.get("Retry-After"))
        path = target.split("?", 1)[0]
        text = f"{method} {path}: {status} {code or cls.reason}"
        if message:
            text += f": {message}"
        return cls(text, status=status, code=code, retry_after=retry_after)


def _oci_error(data: bytes) -> tuple[str, str]:
    """The first OCI error (``{"errors": [{"code", "message"}]}``) in a body, if any."""
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        return "", data[:200].decode("utf-8", "replace").strip()
    errors = parsed.get("errors") if isinstance(parsed, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        return str(errors[0].get("code") or ""), str(errors[0].get("message") or "")
    return "", ""


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
