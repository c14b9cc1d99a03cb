"""``cpctl serve``: the HTTP API, the dashboard and ``/metrics`` (``controlplane.api``);
and ``cpctl worker --metrics-listen``: a worker's own ``/metrics`` and ``/healthz``.

The tokens come from ``--token-file`` (one token, or ``NAME: TOKEN`` lines: each client
its own, and history records which one asked) or ``$CONTROLPLANE_API_TOKEN``, never from
the command line (where ``ps`` would show them); the access log redacts them from URLs.
HTTPS with ``--tls-cert``/``--tls-key``; without them only a loopback ``--listen`` is
served unless ``--insecure``. Runs until SIGTERM/SIGINT.

Once it serves it prints the address a browser on this machine opens and how to sign in:
a one-time link (``/login?code=...``, :mod:`controlplane.api.login`) whose cookie opens
the dashboard's reads, or the token typed into the page's sign-in form.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from controlplane.api.login import CODE_SECONDS, Login
from controlplane.cli.context import clock
from controlplane.clock import new_id
from controlplane.errors import UsageError
from controlplane.exposition import CONTENT_TYPE
from controlplane.gc_tuning import tune_for_service
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate
from controlplane.store.database import open_database
from controlplane.worker.loop import Worker

MIN_TOKEN = 16


def _tokens(args: argparse.Namespace) -> dict[str, str]:
    """The API's tokens by name. A ``--token-file`` holds one token (named ``default``)
    or one ``NAME: TOKEN`` per line (``#`` comments and blank lines skipped), so that each
    client has its own and history records which one asked; else
    ``$CONTROLPLANE_API_TOKEN`` (named ``default``)."""
    if args.token_file:
        try:
            text = Path(args.token_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {args.token_file!r}: "
                             f"{exc.strerror}") from None
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.strip() and not ln.strip().startswith("#")]
        where = f"--token-file {args.token_file}"
        if len(lines) == 1 and ":" not in lines[0]:
            tokens = {"default": lines[0]}
        else:
            tokens = {}
            for number, line in enumerate(lines, 1):
                name, sep, token = (part.strip() for part in line.partition(":"))
                if not sep or not name or not token:
                    raise UsageError(f"{where} line {number}: expected NAME: TOKEN",
                                     hint="one token per line, e.g. 'ci-bot: <token>'")
                if name in tokens:
                    raise UsageError(f"{where} line {number}: token name {name!r} given "
                                     "twice")
                tokens[name] = token
    else:
        token = os.environ.get("CONTROLPLANE_API_TOKEN", "").strip()
        if not token:
            raise UsageError("the API requires a bearer token, and none was given",
                             hint=f"make one (`openssl rand -hex 24 > api.token`, at least "
                                  f"{MIN_TOKEN} characters) and pass --token-file api.token, "
                                  "or set $CONTROLPLANE_API_TOKEN")
        tokens = {"default": token}
    short = sorted(name for name, token in tokens.items() if len(token) < MIN_TOKEN)
    if not tokens or short:
        raise UsageError("the API needs tokens of at least 16 characters" +
                         (f" (too short: {', '.join(short)})" if short else ""),
                         hint="put one in a file for --token-file, or in "
                         "$CONTROLPLANE_API_TOKEN")
    return tokens


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _tls(args: argparse.Namespace, host: str) -> ssl.SSLContext | None:
    """The TLS context from ``--tls-cert``/``--tls-key``; refuse to serve the token in
    clear text on anything but loopback unless ``--insecure``."""
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if bool(cert) != bool(key):
        raise UsageError("--tls-cert and --tls-key go together",
                         hint="give both (PEM files), or neither for plain HTTP on loopback")
    if not cert:
        if not _loopback(host) and not getattr(args, "insecure", False):
            raise UsageError(f"--listen {host} is not a loopback address and no TLS is "
                             "configured: bearer tokens would cross the network in clear "
                             "text", hint="give --tls-cert and --tls-key, or --insecure "
                             "to serve plain HTTP anyway (e.g. behind a TLS proxy)")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load --tls-cert {cert} / --tls-key {key}: {exc}") from None
    return context


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8080")
    return host, int(port)


async def serve_cmd(args: argparse.Namespace) -> int:
    from controlplane.api.app import make_app

    tune_for_service()
    tokens = _tokens(args)
    host, port = _listen(args.listen)
    tls = _tls(args, host)
    db = open_database(args.db)
    try:
        await migrate.require_current(db)
        async with contextlib.AsyncExitStack() as stack:
            cluster = None
            if getattr(args, "kubeconfig", None) or getattr(args, "in_cluster", False):
                from controlplane.wiring.cluster import access_from_args

                cluster = await stack.enter_async_context(access_from_args(db, args))
            sign_in = Login(_secret, clock.now())
            app = make_app(db, token=tokens, kinds=default_kinds(), clock=clock,
                           metrics_public=args.metrics_public, cluster=cluster,
                           sign_in=sign_in)
            await _serve_until_stopped(app, host, port, tls, sign_in=sign_in,
                                       token_source=_token_source(args))
    finally:
        await db.dispose()
    return 0


def _secret() -> str:
    """An unguessable string for the sign-in link's code and its sessions (244 bits)."""
    return (new_id() + new_id()).replace("-", "")


def _token_source(args: argparse.Namespace) -> str:
    return f"--token-file {args.token_file}" if args.token_file else "$CONTROLPLANE_API_TOKEN"


def browser_url(scheme: str, host: str, port: int) -> str:
    """The address a browser on this machine opens: a wildcard listen address (``0.0.0.0``,
    ``::``) is reached on loopback; an IPv6 address goes in brackets."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"


def ready_lines(url: str, code: str | None, token_source: str) -> str:
    """What ``cpctl serve`` prints once it serves: where, and how a browser signs in.
    Scripts read the address as the word after ``on`` on the first line."""
    lines = [f"API and dashboard on {url}"]
    if code:
        lines.append(f"sign in: open {url}login?code={code} (once, within "
                     f"{CODE_SECONDS // 60} minutes)")
    lines.append(f"{'or' if code else 'sign in:'} enter the token ({token_source}) in the "
                 "page's form; scripts send 'Authorization: Bearer <token>'")
    return "\n".join(lines)


async def _serve_until_stopped(app: web.Application, host: str, port: int,
                               tls: ssl.SSLContext | None = None, *,
                               sign_in: Login | None = None,
                               token_source: str = "$CONTROLPLANE_API_TOKEN") -> None:
    """Serve ``app`` on ``host:port`` (HTTPS with ``tls``) until SIGTERM or SIGINT."""
    from controlplane.api.serving import make_runner

    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    url = browser_url("https" if tls is not None else "http", str(bound[0]), int(bound[1]))
    print(ready_lines(url, sign_in.code if sign_in else None, token_source), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


@asynccontextmanager
async def worker_endpoints(worker: Worker, listen: str) -> AsyncIterator[str]:
    """``cpctl worker --metrics-listen``: the worker's own ``/metrics`` and ``/healthz``
    while the body runs; yields the bound ``host:port``.

    ``/healthz`` is 503 once the worker is stopping, or when its claim loop has not turned
    for ten poll intervals (at least 30 s): a liveness probe restarts a wedged worker.
    No token: it shows counters only, no operation or workload names.
    """
    from aiohttp import web

    host, port = _listen(listen)
    stale_after = max(30.0, 10 * worker.config.poll_seconds)

    async def metrics(_: web.Request) -> web.Response:
        text = worker.metrics.render(worker.config.worker_id, worker.in_flight)
        return web.Response(text=text, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        age = worker.metrics.loop_age()
        if worker.stopping or age > stale_after:
            status = "stopping" if worker.stopping else f"claim loop stalled for {age:.0f}s"
            return web.json_response({"status": status}, status=503)
        return web.json_response({"status": "ok", "in_flight": worker.in_flight})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0] if runner.addresses else (host, port)
        yield f"{bound[0]}:{bound[1]}"
    finally:
        await runner.cleanup()
