"""Typed errors and retries of the HTTP client, against a registry scripted to misbehave.

Pins: 429 is retried after ``Retry-After`` (never sleeping for real in tests: the sleep is
injected), a ``Retry-After`` beyond the cap fails at once; 5xx is retried up to
``attempts`` and then raised as retryable; a slow registry is a ``RegistryTimeout``; 403
is ``RegistryForbidden``; a registry lying about a digest is ``RegistryBadResponse``.
Each error is chained from what caused it and maps onto the worker's retryable/terminal
errors and the observer's ``ProbeError``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from controlplane.engine.observation import Interests, ProbeError
from controlplane.machines.contract.actions import delete_manifest
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from drivers.registry import ManifestActions, RegistryClient, RegistryObserver
from drivers.registry.errors import (
    RegistryBadResponse,
    RegistryForbidden,
    RegistryServerError,
    RegistryTimeout,
    RegistryTooManyRequests,
    RegistryUnauthorized,
)
from drivers.registry.transport import RegistrySettings
from tests.registry.servers import FakeRegistry, oci_error

BODY = b'{"schemaVersion":2,"annotations":{"k":"v"}}'
DIGEST = "sha256:" + hashlib.sha256(BODY).hexdigest()


@pytest.fixture
async def fake() -> AsyncIterator[FakeRegistry]:
    async with FakeRegistry() as server:
        yield server


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def client(sleeps: Sleeps, **overrides: float) -> RegistryClient:
    settings = RegistrySettings(attempts=3, backoff_initial=0.1, request_timeout=5,
                                max_retry_after=30)
    return RegistryClient(RegistrySettings(**{**settings.__dict__, **overrides}), sleep=sleeps)


def manifest_ok(request: web.Request) -> web.Response:
    headers = {"Docker-Content-Digest": DIGEST,
               "Content-Type": "application/vnd.oci.image.manifest.v1+json"}
    return web.Response(body=b"" if request.method == "HEAD" else BODY, headers=headers)


async def test_throttled_request_is_retried_after_retry_after(fake: FakeRegistry) -> None:
    answers = iter([oci_error(429, "TOOMANYREQUESTS", "slow down", {"Retry-After": "7"})])

    async def handler(request: web.Request) -> web.StreamResponse:
        return next(answers, None) or manifest_ok(request)

    fake.handler = handler
    sleeps = Sleeps()
    c = client(sleeps)
    try:
        resolved = await c.resolve(f"{fake.host}/app", "v1")
        assert resolved is not None
        assert resolved.annotations == {"k": "v"}
        assert sleeps.waits == [7.0]
    finally:
        await c.close()


async def test_retry_after_beyond_the_cap_fails_at_once(fake: FakeRegistry) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return oci_error(429, "TOOMANYREQUESTS", "come back tomorrow", {"Retry-After": "86400"})

    fake.handler = handler
    sleeps = Sleeps()
    c = client(sleeps)
    try:
        with pytest.raises(RegistryTooManyRequests) as caught:
            await c.resolve(f"{fake.host}/app", "v1")
        assert caught.value.retry_after == 86400
        assert caught.value.retryable
        assert sleeps.waits == []
    finally:
        await c.close()


async def test_server_errors_are_retried_then_raised_as_retryable(fake: FakeRegistry) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return oci_error(503, "UNAVAILABLE", "down for maintenance")

    fake.handler = handler
    sleeps = Sleeps()
    c = client(sleeps)
    repo = f"{fake.host}/app"
    try:
        with pytest.raises(RegistryServerError, match="503"):
            await c.resolve(repo, "v1")
        assert len(fake.seen) == 3
        assert sleeps.waits == [0.1, 0.2]
        fact = (await RegistryObserver(c).observe(Interests(tags=frozenset({f"{repo}:v1"})))
                ).tags[f"{repo}:v1"]
        assert isinstance(fact, ProbeError)
        assert fact.retryable
        with pytest.raises(RetryableActionError) as caught:
            await ManifestActions(c).handlers()["DeleteManifest"](
                delete_manifest("k", repository=repo, digest=DIGEST))
        assert isinstance(caught.value.__cause__, RegistryServerError)
    finally:
        await c.close()


async def test_a_registry_that_recovers_answers_after_a_retry(fake: FakeRegistry) -> None:
    failures = [oci_error(500, "", "boom")]

    async def handler(request: web.Request) -> web.StreamResponse:
        return failures.pop() if failures else manifest_ok(request)

    fake.handler = handler
    c = client(Sleeps())
    try:
        resolved = await c.resolve(f"{fake.host}/app", "v1")
        assert resolved is not None
        assert resolved.digest == DIGEST
    finally:
        await c.close()


async def test_a_silent_registry_times_out(fake: FakeRegistry) -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return manifest_ok(request)

    fake.handler = handler
    c = client(Sleeps(), request_timeout=0.2, attempts=1)
    try:
        with pytest.raises(RegistryTimeout) as caught:
            await c.resolve(f"{fake.host}/app", "v1")
        assert isinstance(caught.value.__cause__, TimeoutError)
    finally:
        release.set()
        await c.close()


async def test_forbidden_is_terminal_for_the_gc_action(fake: FakeRegistry) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return oci_error(403, "DENIED", "requested access to the resource is denied")

    fake.handler = handler
    c = client(Sleeps())
    try:
        with pytest.raises(RegistryForbidden):
            await c.delete_manifest(f"{fake.host}/app", DIGEST)
        with pytest.raises(TerminalActionError) as caught:
            await ManifestActions(c).handlers()["DeleteManifest"](
                delete_manifest("k", repository=f"{fake.host}/app", digest=DIGEST))
        assert caught.value.error_class == "Forbidden"
        assert len(fake.seen) == 2  # no retries of a 403
    finally:
        await c.close()


async def test_a_registry_lying_about_a_digest_is_a_bad_response(fake: FakeRegistry) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"" if request.method == "HEAD" else b'{"other":1}',
                            headers={"Docker-Content-Digest": DIGEST})

    fake.handler = handler
    c = client(Sleeps())
    try:
        with pytest.raises(RegistryBadResponse, match="sha256"):
            await c.resolve(f"{fake.host}/app", "v1")
    finally:
        await c.close()


async def test_a_401_without_a_usable_challenge_is_unauthorized(fake: FakeRegistry) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return oci_error(401, "UNAUTHORIZED", "who are you", {"WWW-Authenticate": "Magic x"})

    fake.handler = handler
    c = client(Sleeps())
    try:
        with pytest.raises(RegistryUnauthorized):
            await c.resolve(f"{fake.host}/app", "v1")
    finally:
        await c.close()
