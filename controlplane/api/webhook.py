"""The mutating admission webhook that holds a StatefulSet's successor pod for a restore.

``POST /mutate/pods`` answers AdmissionReviews with ``controlplane.app.successor_gate``,
looking the pod up with a lookup (``controlplane.store.successors.awaiting_successor``
in production) bounded by a short timeout. It FAILS OPEN: a lookup error or timeout
answers "allowed, no patch" and is logged, so a slow or unreachable database never blocks
a StatefulSet from creating its pods (the migration then finds its successor ungated and
fails loudly). ``GET /healthz`` serves the readiness probe and the counters.

Called by ``cpctl webhook serve`` (:func:`serve_webhook`) and by tests
(:func:`running_webhook`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from aiohttp import web

from controlplane.api.serving import make_runner
from controlplane.app.successor_gate import admission_response, needs_gate_lookup
from controlplane.logs import get_logger
from controlplane.store.database import Database
from controlplane.store.successors import awaiting_successor

log = get_logger("controlplane.webhook")

#: ``(namespace, name) -> the id of the migration awaiting that pod, or None``.
Lookup = Callable[[str, str], Awaitable[str | None]]

#: Well under the webhook's ``timeoutSeconds: 2`` (deploy/), so the API server hears
#: our fail-open answer instead of timing out on its side.
LOOKUP_TIMEOUT = 1.0

#: How often a serving certificate's files are checked for a renewal (cert-manager
#: renews days before expiry, so a minute is plenty).
CERT_CHECK_SECONDS = 60.0

#: AdmissionReviews are small; a pod with a huge spec is still far under this.
MAX_REVIEW_BYTES = 4 * 1024 * 1024


@dataclass
class WebhookStats:
    """What ``/healthz`` reports: reviews answered, pods gated, lookups failed open."""

    reviews: int = 0
    lookups: int = 0
    gated: int = 0
    failed_open: int = 0


STATS_KEY = web.AppKey("stats", WebhookStats)


def make_webhook_app(lookup: Lookup, *, lookup_timeout: float = LOOKUP_TIMEOUT
                     ) -> web.Application:
    """The webhook's routes; its :class:`WebhookStats` is ``app[STATS_KEY]``."""
    stats = WebhookStats()

    async def mutate(request: web.Request) -> web.Response:
        try:
            review = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        if not isinstance(review, Mapping) or not isinstance(review.get("request"), Mapping):
            raise web.HTTPBadRequest(text="not an AdmissionReview: no request")
        stats.reviews += 1
        target = needs_gate_lookup(review)
        operation = warning = None
        if target is not None:
            stats.lookups += 1
            operation, warning = await _look_up(lookup, target, lookup_timeout, stats)
            if operation is not None:
                stats.gated += 1
                log.info("pod gated", pod="/".join(target), migration=operation)
        return web.json_response(admission_response(review, operation, warning=warning))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **asdict(stats)})

    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app[STATS_KEY] = stats
    app.router.add_post("/mutate/pods", mutate)
    app.router.add_get("/healthz", healthz)
    return app


async def _look_up(lookup: Lookup, target: tuple[str, str], seconds: float,
                   stats: WebhookStats) -> tuple[str | None, str | None]:
    """``(operation, None)``, or ``(None, warning)`` when the lookup failed: fail open."""
    namespace, name = target
    try:
        async with asyncio.timeout(seconds):
            return await lookup(namespace, name), None
    except Exception as exc:  # any failure: the pod is admitted ungated, never refused
        stats.failed_open += 1
        reason = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
        log.warning("pod admitted without the restore gate", pod=f"{namespace}/{name}",
                    lookup=reason, error=str(exc))
        return None, (f"checkpoint control plane: {namespace}/{name} admitted without the "
                      f"restore gate, the migration lookup {reason}")


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context from PEM files (the API server speaks TLS 1.2+)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class ServingCertificate:
    """The TLS context of PEM files that get replaced while we serve (cert-manager renews
    the Secret, the kubelet swaps the mounted files): :meth:`reload_if_changed` loads
    them into the same context, so new connections get the new certificate."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = server_ssl_context(cert_file, key_file)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        # stat() follows the Secret volume's symlinks to the current files.
        return tuple((st.st_ino, st.st_mtime_ns)
                     for st in (os.stat(self.cert_file), os.stat(self.key_file)))

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last load; ``True`` if it did.
        A half-written pair (a key not matching the certificate) is left for next time,
        the old certificate still served."""
        try:
            stamp = self._stamp()
            if stamp == self._seen:
                return False
            with tempfile.TemporaryDirectory() as scratch:
                # One snapshot of the pair, checked on a scratch context first: a failed
                # load into the live context would leave it with a mismatched key.
                cert = shutil.copy(self.cert_file, os.path.join(scratch, "tls.crt"))
                key = shutil.copy(self.key_file, os.path.join(scratch, "tls.key"))
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
                self.context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded, the previous one kept",
                        error=str(exc))
            return False
        self._seen = stamp
        log.info("serving certificate reloaded", cert=self.cert_file)
        return True

    async def follow(self, *, every: float = CERT_CHECK_SECONDS) -> None:
        """Reload on change, checking every ``every`` seconds, until cancelled (files
        have no event to await that survives the kubelet's symlink swap)."""
        while True:
            await asyncio.sleep(every)
            self.reload_if_changed()


@asynccontextmanager
async def running_webhook(app: web.Application, *, host: str, port: int,
                          ssl_context: ssl.SSLContext | None) -> AsyncIterator[tuple[str, int]]:
    """Serve ``app`` on ``host:port`` (0: any free port) while the body runs; yields the
    bound address."""
    runner = make_runner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        bound: Any = runner.addresses[0] if runner.addresses else (host, port)
        yield str(bound[0]), int(bound[1])
    finally:
        await runner.cleanup()


async def serve_webhook(db: Database, *, host: str, port: int, cert_file: str,
                        key_file: str, lookup_timeout: float = LOOKUP_TIMEOUT) -> None:
    """``cpctl webhook serve``: serve over TLS until SIGTERM or SIGINT."""
    app = make_webhook_app(partial(awaiting_successor, db), lookup_timeout=lookup_timeout)
    certificate = ServingCertificate(cert_file, key_file)
    async with running_webhook(app, host=host, port=port,
                               ssl_context=certificate.context) as bound:
        print(f"admission webhook on https://{bound[0]}:{bound[1]}/mutate/pods", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        follower = asyncio.create_task(certificate.follow())
        try:
            await stop.wait()
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
