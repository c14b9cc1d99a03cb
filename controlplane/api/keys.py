"""The typed keys under which :func:`controlplane.api.app.make_app` keeps what the
handlers need (the database, the kinds, the clock, the tokens, the cluster, the limits,
the sign-in link),
and the paths served without a token. Their own module, so every page's routes
(``api.summary`` as well as ``api.app``) read them without importing each other."""

from __future__ import annotations

from aiohttp import web

from controlplane.clock import Clock
from controlplane.engine.kinds import KindRegistry
from controlplane.machines.submission import Limits
from controlplane.store.database import Database

#: Pages that hold no data (their scripts fetch with the token) and the public documents.
#: ``/login`` spends a one-time sign-in link (``api.login``).
PUBLIC_PATHS = frozenset({"/", "/summary", "/healthz", "/api/v1/openapi.json", "/login"})

DB_KEY = web.AppKey("db", Database)
KINDS_KEY = web.AppKey("kinds", KindRegistry)
CLOCK_KEY = web.AppKey("clock", Clock)
TOKEN_KEY = web.AppKey("tokens", tuple)  # ((name, token bytes), ...)
REQUESTER = web.RequestKey("requester", str)  # who asked: token:<name>
PUBLIC_KEY = web.AppKey("public", frozenset)
CLUSTER_KEY = web.AppKey("cluster", object)
LIMITS_KEY = web.AppKey("limits", Limits)
LOGIN_KEY = web.AppKey("login", object)  # api.login.Login | None
