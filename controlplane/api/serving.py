"""Running the API: an access logger that never writes the token, and ``make_runner``.

The dashboard URL carries the token in ``?token=``, and aiohttp's default access log
writes the request line with its query string. Whoever runs ``make_app`` (the CLI, the
tests) must use :class:`RedactingAccessLogger`; ``make_runner`` does.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlencode

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

SECRET_PARAMS = frozenset({"token", "access_token", "code"})  # code: the sign-in link's


def redact(path_qs: str) -> str:
    """``/?token=abc&select=x`` -> ``/?token=REDACTED&select=x`` (pure)."""
    path, sep, query = path_qs.partition("?")
    if not sep:
        return path
    pairs = [(k, "REDACTED" if k.lower() in SECRET_PARAMS else v)
             for k, v in parse_qsl(query, keep_blank_values=True)]
    return f"{path}?{urlencode(pairs)}"


class RedactingAccessLogger(AbstractAccessLogger):
    """One line per request: method, path (secrets redacted), status, size, seconds."""

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)

    def log(self, request: web.BaseRequest, response: web.StreamResponse,
            time: float) -> None:
        self.logger.info("%s %s %s %s %.3fs", request.method, redact(request.path_qs),
                         response.status, response.body_length, time)


def make_runner(app: web.Application) -> web.AppRunner:
    """An ``AppRunner`` with the redacting access log (``await runner.setup()`` next)."""
    return web.AppRunner(app, access_log_class=RedactingAccessLogger)
