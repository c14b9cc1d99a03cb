"""Registries the registry and agent tests run against, all on loopback.

- :func:`run_registry`: the real thing — Debian's ``docker-registry`` (CNCF distribution
  v2), started with a temporary config and storage directory; deletes enabled or not;
  anonymous, htpasswd (basic) or token (bearer) auth. A missing binary FAILS the test
  (never skips) and says to run ``scripts/ensure-registry``.
- :class:`TokenServer`: a tiny aiohttp token endpoint for the registry's token auth: it
  checks basic credentials, grants scopes by a policy and signs RS256 JWTs with a
  throwaway key (``openssl``), whose certificate the registry trusts.
- :class:`FakeRegistry`: an aiohttp app that answers what a test scripts (429 with
  ``Retry-After``, 5xx, slow answers, lying digests) — what no real registry does on
  demand.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

REGISTRY_BIN = os.environ.get("CONTROLPLANE_TEST_REGISTRY_BIN", "/usr/bin/docker-registry")
ENSURE = "scripts/ensure-registry"


@dataclass
class RunningRegistry:
    host: str  # 127.0.0.1:<port>: the registry part of references
    storage: Path
    output: list[str] = field(default_factory=list)

    def repo(self, name: str) -> str:
        return f"{self.host}/{name}"


def bcrypt_htpasswd(user: str, password: str) -> str:
    """An htpasswd line with a bcrypt hash (the only kind distribution accepts)."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = base64.b64encode(os.urandom(16), altchars=b"./")[:22]
    hashed = lib.crypt(password.encode(), b"$2b$05$" + salt)
    assert hashed, "libcrypt refused the bcrypt salt"
    assert hashed.startswith(b"$2b$"), "libcrypt has no bcrypt"
    return f"{user}:{hashed.decode()}\n"


LISTENING = re.compile(r"listening on (127\.0\.0\.1:\d+)")


def require_registry() -> None:
    if not os.access(REGISTRY_BIN, os.X_OK):
        pytest.fail(f"the OCI registry {REGISTRY_BIN} is missing: run {ENSURE} (it installs "
                    "Debian's docker-registry package); these tests are never skipped",
                    pytrace=False)


def write_registry_config(workdir: Path, *, delete: bool = True,
                          auth: dict[str, Any] | None = None) -> Path:
    """A config for ``docker-registry serve``: storage under ``workdir``, a free port."""
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "storage")},
                    "delete": {"enabled": delete}, "maintenance": {"uploadpurging": {
                        "enabled": False}}},
        "http": {"addr": "127.0.0.1:0", "secret": "controlplane-tests"},
    }
    if auth:
        config["auth"] = auth
    path = workdir / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@contextlib.asynccontextmanager
async def run_registry(workdir: Path, *, delete: bool = True,
                       auth: dict[str, Any] | None = None) -> AsyncIterator[RunningRegistry]:
    """Start ``docker-registry serve`` on 127.0.0.1:<free port>; stop it afterwards."""
    require_registry()
    path = await asyncio.to_thread(write_registry_config, workdir, delete=delete, auth=auth)
    storage = workdir / "storage"
    proc = await asyncio.create_subprocess_exec(
        REGISTRY_BIN, "serve", str(path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    running = RunningRegistry("", storage)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(20):
            while not running.host:
                line = (await proc.stdout.readline()).decode("utf-8", "replace")
                if not line:
                    raise RuntimeError("docker-registry exited: " + "".join(running.output))
                running.output.append(line)
                found = LISTENING.search(line)
                if found:
                    running.host = found.group(1)
        drain = asyncio.get_running_loop().create_task(_drain(proc.stdout, running.output))
        yield running
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if "drain" in locals():
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


async def _drain(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode("utf-8", "replace"))
        del into[:-200]


# --- bearer tokens -------------------------------------------------------------------------

Policy = Callable[[str, str, str, list[str]], list[str]]  # user, type, name, asked -> granted


def allow_all(user: str, type_: str, name: str, asked: list[str]) -> list[str]:
    return asked


class TokenServer:
    """``GET /token?service=&scope=`` with basic auth -> ``{"token", "expires_in"}``."""

    def __init__(self, workdir: Path, *, users: dict[str, str], service: str = "test-registry",
                 issuer: str = "test-issuer", policy: Policy = allow_all,
                 anonymous: bool = False) -> None:
        self.workdir = workdir
        self.users = users
        self.service = service
        self.issuer = issuer
        self.policy = policy
        self.anonymous = anonymous
        self.issued: list[tuple[str, str]] = []  # (user, scope) of every token
        self.refused = 0
        self.key = workdir / "token.key"
        self.cert = workdir / "token.crt"
        self.url = ""
        self._runner: web.AppRunner | None = None

    def registry_auth(self) -> dict[str, Any]:
        return {"token": {"realm": f"{self.url}/token", "service": self.service,
                          "issuer": self.issuer, "rootcertbundle": str(self.cert)}}

    async def __aenter__(self) -> TokenServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
            str(self.key), "-out", str(self.cert), "-days", "2", "-subj", "/CN=test-token",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        assert proc.returncode == 0, f"openssl failed: {err.decode()}"
        app = web.Application()
        app.router.add_get("/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _token(self, request: web.Request) -> web.Response:
        user = ""
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(name) != password:
                self.refused += 1
                return web.json_response({"details": "wrong credentials"}, status=401)
            user = name
        elif not self.anonymous:
            self.refused += 1
            return web.json_response({"details": "credentials required"}, status=401)
        access = []
        scopes = request.query.getall("scope", [])
        for scope in scopes:
            type_, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            granted = self.policy(user, type_, name, actions.split(","))
            if granted:
                access.append({"type": type_, "name": name, "actions": granted})
        self.issued.append((user, " ".join(scopes)))
        token = await self._sign({"iss": self.issuer, "sub": user, "aud": self.service,
                                  "exp": int(time.time()) + 300, "nbf": int(time.time()) - 5,
                                  "iat": int(time.time()), "jti": os.urandom(8).hex(),
                                  "access": access})
        return web.json_response({"token": token, "expires_in": 300})

    async def _sign(self, claims: dict[str, Any]) -> str:
        der = await _run("openssl", "x509", "-in", str(self.cert), "-outform", "DER")
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = await _run("openssl", "dgst", "-sha256", "-sign", str(self.key),
                               stdin=signing_input.encode())
        return f"{signing_input}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def _run(*argv: str, stdin: bytes | None = None) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin)
    assert proc.returncode == 0, err.decode()
    return out


# --- scripted failures ---------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeRegistry:
    """A loopback HTTP server whose every request goes to :attr:`handler` (set by tests)."""

    def __init__(self) -> None:
        self.handler: Handler = self._not_found
        self.seen: list[tuple[str, str]] = []
        self.host = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeRegistry:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.host = f"127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path))
        return await self.handler(request)

    @staticmethod
    async def _not_found(request: web.Request) -> web.StreamResponse:
        return oci_error(404, "MANIFEST_UNKNOWN", "manifest unknown")


def oci_error(status: int, code: str, message: str,
              headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"errors": [{"code": code, "message": message}]}, status=status,
                             headers=headers)
