"""``cpctl serve``: the HTTP API, the dashboard and ``/metrics`` (``controlplane.api``);
and ``cpctl worker --metrics-listen``: a worker's own ``/metrics`` and ``/healthz``.

The token comes from ``--token-file`` or ``$CONTROLPLANE_API_TOKEN``, never from the
command line (where ``ps`` would show it); the access log redacts it from URLs. Runs
until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from controlplane.cli.context import clock
from controlplane.errors import UsageError
from controlplane.exposition import CONTENT_TYPE
from controlplane.gc_tuning import tune_for_service
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate
from controlplane.store.database import open_database
from controlplane.worker.runtime import Worker


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {args.token_file!r}: "
                             f"{exc.strerror}") from None
    else:
        token = os.environ.get("CONTROLPLANE_API_TOKEN", "").strip()
    if len(token) < 16:
        raise UsageError("the API needs a token of at least 16 characters",
                         hint="put one in a file for --token-file, or in "
                         "$CONTROLPLANE_API_TOKEN")
    return token


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8080")
    return host, int(port)


async def serve_cmd(args: argparse.Namespace) -> int:
    from controlplane.api.app import make_app

    tune_for_service()
    token = _token(args)
    host, port = _listen(args.listen)
    db = open_database(args.db)
    try:
        await migrate.require_current(db)
        async with contextlib.AsyncExitStack() as stack:
            cluster = None
            if getattr(args, "kubeconfig", None) or getattr(args, "in_cluster", False):
                from controlplane.wiring.cluster import access_from_args

                cluster = await stack.enter_async_context(access_from_args(db, args))
            app = make_app(db, token=token, kinds=default_kinds(), clock=clock,
                           metrics_public=args.metrics_public, cluster=cluster)
            await _serve_until_stopped(app, host, port)
    finally:
        await db.dispose()
    return 0


async def _serve_until_stopped(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or SIGINT."""
    from controlplane.api.serving import make_runner

    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    print(f"API and dashboard on http://{bound[0]}:{bound[1]}/", flush=True)
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
        print(f"worker metrics on http://{bound[0]}:{bound[1]}/metrics", flush=True)
        yield f"{bound[0]}:{bound[1]}"
    finally:
        await runner.cleanup()
