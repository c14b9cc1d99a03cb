"""The aiohttp application: JSON API, ``/metrics`` and the dashboard page.

``make_app`` is the factory a composition root (the CLI, tests) calls with an open
:class:`Database`. Reads go through ``controlplane.store.queries``/``reports``; commands
through ``controlplane.app.operations.send_command``, so validation stays the decider's.
Errors are JSON ``{"error": message, "parameter"?: name}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from controlplane.api import dashboard, login, metrics, params, summary
from controlplane.api.keys import (
    CLOCK_KEY,
    CLUSTER_KEY,
    DB_KEY,
    KINDS_KEY,
    LIMITS_KEY,
    LOGIN_KEY,
    PUBLIC_KEY,
    PUBLIC_PATHS,
    REQUESTER,
    TOKEN_KEY,
)
from controlplane.api.openapi import document
from controlplane.api.pages import page_headers
from controlplane.app.drains import drain_children
from controlplane.app.operation_doc import operation_json
from controlplane.app.operations import send_command
from controlplane.app.plan import plan_request
from controlplane.app.ports import ClusterAccess
from controlplane.app.replay import phase_after_each
from controlplane.app.requester import token_requester
from controlplane.app.requests import RequestRefused, parse, prepare_asked, submit
from controlplane.clock import Clock, SystemClock, new_id
from controlplane.engine.commands import Command
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import ControlPlaneError, UsageError
from controlplane.machines.base.commands import Cancel, Retarget
from controlplane.machines.catalog import default_kinds, requested_kinds
from controlplane.machines.drain.state import KIND as DRAIN
from controlplane.machines.submission import Limits
from controlplane.store import queries, reports
from controlplane.store.database import Database
from controlplane.store.errors import MachineNotFound, WorkloadBusy
from controlplane.store.records import MachineRecord, RecordedEvent

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(db: Database, *, token: str | Mapping[str, str],
             kinds: KindRegistry | None = None,
             clock: Clock | None = None, metrics_public: bool = False,
             cluster: ClusterAccess | None = None,
             limits: Limits | None = None,
             sign_in: login.Login | None = None) -> web.Application:
    """The API application. ``token`` is required on every route but ``/``, ``/healthz``
    and the OpenAPI document (and ``/metrics`` when ``metrics_public``): one token (named
    ``default``) or several by name; the name of the one presented is recorded as who
    asked (``token:<name>``) on the events a request causes. ``cluster`` is
    what submissions read (``POST /api/v1/operations`` answers 503 without one);
    ``limits`` are the admission limits they are held to. ``sign_in``: the one-time link
    ``cpctl serve`` prints, whose cookie opens the reads to a browser (``api.login``)."""
    tokens = {"default": token} if isinstance(token, str) else dict(token)
    if not tokens or not all(tokens.values()):
        raise ValueError("an API token is required")
    app = web.Application(client_max_size=MAX_BODY,
                          middlewares=[_errors_middleware, _auth_middleware])
    app[DB_KEY] = db
    app[KINDS_KEY] = kinds if kinds is not None else default_kinds()
    app[CLOCK_KEY] = clock if clock is not None else SystemClock()
    app[TOKEN_KEY] = tuple((name, value.encode()) for name, value in sorted(tokens.items()))
    app[PUBLIC_KEY] = PUBLIC_PATHS | ({"/metrics"} if metrics_public else frozenset())
    app[CLUSTER_KEY] = cluster
    app[LIMITS_KEY] = limits if limits is not None else Limits()
    app[LOGIN_KEY] = sign_in
    app.router.add_get("/", _dashboard)
    app.router.add_get(login.PATH, _login)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/api/v1/openapi.json", _openapi)
    app.router.add_get("/api/v1/operations", _list_operations)
    app.router.add_post("/api/v1/operations", _submit)
    app.router.add_get("/api/v1/operations/{id}", _get_operation)
    app.router.add_get("/api/v1/operations/{id}/events", _operation_events)
    app.router.add_post("/api/v1/operations/{id}/cancel", _cancel)
    app.router.add_post("/api/v1/operations/{id}/retarget", _retarget)
    app.router.add_get("/api/v1/reports/{report}", _report)
    summary.add_routes(app)
    return app


# -- plumbing ---------------------------------------------------------------------------

def _default(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _json(data: Any, *, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=_default), status=status,
                        content_type="application/json")


def _revalidated(request: web.Request, data: Any) -> web.Response:
    """``data`` as JSON with a strong ``ETag`` (a hash of the body); ``304`` with no body
    when the request's ``If-None-Match`` names it. A polling dashboard re-asks every few
    seconds: an unchanged answer costs the query but not the transfer or the redraw."""
    body = json.dumps(data, default=_default)
    etag = '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    offered = {t.strip() for t in request.headers.get("If-None-Match", "").split(",")}
    if etag in offered or "*" in offered:
        return web.Response(status=304, headers=headers)
    return web.Response(text=body, content_type="application/json", headers=headers)


def _error(status: int, message: str, parameter: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if parameter is not None:
        body["parameter"] = parameter
    return _json(body, status=status)


@web.middleware
async def _auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in request.app[PUBLIC_KEY]:
        return await handler(request)
    header = request.headers.get("Authorization", "")
    sign_in = request.app[LOGIN_KEY]
    session = request.cookies.get(login.COOKIE, "")
    # The sign-in link's cookie opens reads only: a change always needs the token.
    if not header and session and request.method in ("GET", "HEAD") and \
            isinstance(sign_in, login.Login) and \
            sign_in.valid(session, request.app[CLOCK_KEY].now()):
        request[REQUESTER] = token_requester("sign-in-link")
        return await handler(request)
    scheme, _, presented = header.partition(" ")
    # compare_digest on bytes of any length, against every token: no early exit that
    # would time the token, or which of them matched.
    offered = presented.strip().encode()
    matched = [name for name, value in request.app[TOKEN_KEY]
               if hmac.compare_digest(offered, value)]
    if scheme.lower() != "bearer" or not matched:
        return _error(401, "missing or wrong bearer token "
                           "(send 'Authorization: Bearer <token>')")
    request[REQUESTER] = token_requester(matched[0])
    return await handler(request)


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except params.BadRequest as exc:
        return _error(400, exc.message, exc.parameter)
    except MachineNotFound as exc:
        return _error(404, exc.message)
    except WorkloadBusy as exc:
        return _error(409, str(exc))
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"the body is larger than {MAX_BODY} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise
    except UsageError as exc:
        return _error(400, str(exc))
    except ControlPlaneError as exc:
        log.warning("api request failed: %s %s: %s", request.method, request.path, exc)
        return _error(503, str(exc))


def _operation(record: MachineRecord, *, detail: bool = False) -> dict[str, Any]:
    """The operation's document, as ``cpctl get/list -o json`` prints it."""
    return operation_json(record, detail=detail)


async def _drain_children(db: Database, record: MachineRecord) -> list[dict[str, Any]]:
    return [asdict(c) for c in await drain_children(db, record)]


def _phases(kinds: KindRegistry, record: MachineRecord,
            events: list[RecordedEvent]) -> list[str | None]:
    """The machine's phase after each event (for timelines). History is immutable but
    deciders evolve; an event this build cannot fold gives ``None`` phases rather than
    failing the request."""
    try:
        return list(phase_after_each(kinds, record, events))
    except Exception:  # a display aid must not break the history view
        log.info("cannot fold phases of %s", record.id, exc_info=True)
        return [None] * len(events)


async def _command(request: web.Request, command: Command) -> web.Response:
    app = request.app
    machine_id = request.match_info["id"]
    record = await queries.get_machine(app[DB_KEY], machine_id)  # 404 before 409
    try:
        version = await send_command(app[DB_KEY], app[KINDS_KEY], machine_id=machine_id,
                                     command=command, now=app[CLOCK_KEY].now(),
                                     requester=request[REQUESTER])
    except MachineNotFound:
        raise
    except UsageError as exc:
        return _error(409, str(exc))
    return _json({"id": record.id, "command": command.type, "version": version,
                  "accepted": version != record.version}, status=202)


# -- handlers ---------------------------------------------------------------------------

async def _login(request: web.Request) -> web.Response:
    """``GET /login?code=...``: to the dashboard with the session cookie, or to its
    sign-in form saying the link is spent (``api.login``)."""
    sign_in = request.app[LOGIN_KEY]
    session = sign_in.redeem(request.query.get("code", ""), request.app[CLOCK_KEY].now()) \
        if isinstance(sign_in, login.Login) else None
    if session is None:
        return web.Response(status=303, headers={"Location": "/?signin=expired",
                                                 "Cache-Control": "no-store"})
    response = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store",
                                                 "Referrer-Policy": "no-referrer"})
    response.set_cookie(login.COOKIE, session, max_age=login.SESSION_SECONDS, path="/",
                        httponly=True, samesite="Strict", secure=request.secure)
    return response


async def _dashboard(request: web.Request) -> web.Response:
    return web.Response(text=dashboard.PAGE, content_type="text/html",
                        headers=page_headers(dashboard.CSP))


async def _healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def _openapi(request: web.Request) -> web.Response:
    return _json(document())


async def _metrics(request: web.Request) -> web.Response:
    text = await metrics.render(request.app[DB_KEY], request.app[CLOCK_KEY].now())
    return web.Response(text=text, headers={"Content-Type": metrics.CONTENT_TYPE})


async def _list_operations(request: web.Request) -> web.Response:
    """A page of operations in ``sort`` order (default newest first): ``limit`` of them
    after ``offset``, with the ``total`` the filter selects (a page knows where it is:
    "51-100 of 312")."""
    flt = params.machine_filter(dict(request.query), request.app[KINDS_KEY])
    db = request.app[DB_KEY]
    records = await queries.list_machines(db, flt)
    total = await queries.count_machines(db, flt)
    return _revalidated(request, {"operations": [_operation(r) for r in records],
                                  "limit": flt.limit, "offset": flt.offset,
                                  "sort": flt.order, "total": total})


async def _get_operation(request: web.Request) -> web.Response:
    record = await queries.get_machine(request.app[DB_KEY], request.match_info["id"])
    out = _operation(record, detail=True)
    if record.kind == DRAIN:
        out["children"] = await _drain_children(request.app[DB_KEY], record)
    return _revalidated(request, out)


async def _operation_events(request: web.Request) -> web.Response:
    db = request.app[DB_KEY]
    record = await queries.get_machine(db, request.match_info["id"])
    events = await queries.history(db, record.id)
    phases = _phases(request.app[KINDS_KEY], record, events)
    return _revalidated(request, {"operation": _operation(record), "events": [
        {"seq": e.seq, "type": e.type, "recorded_at": e.recorded_at, "phase": phase,
         "data": e.data, "facts": e.facts, "worker_id": e.worker_id}
        for e, phase in zip(events, phases, strict=True)]})


@runtime_checkable
class _HasObserver(ClusterAccess, Protocol):
    """``make_app``'s ``cluster``, checked at the request (the app key holds ``None``
    when no cluster was given)."""


#: The request fields in snake_case, as every output spells them, and the camelCase the
#: kinds' requests (and the custom resources) read; a body may use either.
SNAKE_FIELDS = {"target_node": "targetNode", "keep_checkpoint": "keepCheckpoint",
                "max_parallel": "maxParallel", "dry_run": "dryRun"}


def _camel_fields(body: dict[str, Any]) -> tuple[dict[str, Any], Callable[[str], str]]:
    """``body`` with its snake_case fields renamed to the camelCase the requests read, and
    how to name a field in an error: as the body spelled it, else in snake_case."""
    out, as_sent = dict(body), {camel: snake for snake, camel in SNAKE_FIELDS.items()}
    for snake, camel in SNAKE_FIELDS.items():
        if snake in out and camel in out:
            raise params.BadRequest(snake, f"{snake} and {camel} are the same field: send one")
        if snake in out:
            out[camel] = out.pop(snake)
        elif camel in out:
            as_sent[camel] = camel  # sent in camelCase: named so
    return out, lambda field: as_sent.get(field, field)


async def _submit(request: web.Request) -> web.Response:
    """Submit an operation as the CLI's verbs do (``kind`` and ``dryRun`` are the
    endpoint's; every other field is the request's, under the names the kinds' requests
    take: ``workload``, ``targetNode``...): 201 with its id (``queued`` says why it
    waits), 200 with the plan for ``dryRun``, 400 for bad input naming the field, 409 when
    the workload has a live operation, 503 when the cluster could not be read."""
    body, spelled = _camel_fields(params.json_fields(await request.read()))
    kind = body.pop("kind", None)
    if not isinstance(kind, str):
        raise params.BadRequest("kind", "kind (a string) is required: one of "
                                        + ", ".join(requested_kinds()))
    dry_run = body.pop("dryRun", False)
    if not isinstance(dry_run, bool):
        raise params.BadRequest(spelled("dryRun"), f"{spelled('dryRun')} must be true or false")
    app = request.app
    access = app[CLUSTER_KEY]
    if not isinstance(access, _HasObserver):
        return _error(503, "this API server has no cluster to submit to: start cpctl serve "
                           "with --kubeconfig or --in-cluster")
    db, now = app[DB_KEY], app[CLOCK_KEY].now()
    if kind not in requested_kinds():
        raise params.BadRequest("kind", f"kind must be one of {', '.join(requested_kinds())}")
    try:
        asked = parse(kind, body)
        if dry_run:
            return _json(await plan_request(db, access, asked, limits=app[LIMITS_KEY],
                                            now=now))
        prepared = await prepare_asked(db, access, asked)
    except RequestRefused as exc:
        message = str(exc)
        for camel in SNAKE_FIELDS.values():  # named as the body named it
            message = re.sub(rf"\b{camel}\b", spelled(camel), message)
        raise params.BadRequest(spelled(exc.field or "body"), message) from None
    outcome = await submit(db, app[KINDS_KEY], prepared, machine_id=new_id(), now=now,
                           limits=app[LIMITS_KEY], requester=request[REQUESTER])
    location = f"/api/v1/operations/{outcome.machine_id}"
    answer: dict[str, Any] = {"id": outcome.machine_id, "kind": kind,
                              "queued": outcome.queued, "location": location}
    moves, left = prepared.shown.get("moves"), prepared.shown.get("left")
    if isinstance(moves, list) and isinstance(left, list):  # a drain: its plan's size
        answer.update(moves=len(moves), left=len(left))
    response = _json(answer, status=201)
    response.headers["Location"] = location
    return response


async def _cancel(request: web.Request) -> web.Response:
    params.json_object(await request.read(), allowed={}, required=frozenset())
    return await _command(request, Cancel())


async def _retarget(request: web.Request) -> web.Response:
    body = params.json_object(await request.read(), allowed={"node": str},
                              required=frozenset({"node"}))
    return await _command(request, Retarget(node=params.node_name(body["node"])))


async def _report(request: web.Request) -> web.Response:
    report = request.match_info["report"]
    if report not in params.REPORTS:
        return _error(404, f"no report {report!r} (reports: {', '.join(params.REPORTS)})")
    by = params.report_by(request.query)
    rows = await reports.report(request.app[DB_KEY], report=report, by=by,
                                since=params.since(request.query.get("since")))
    return _json({"report": report, "by": by, "rows": rows})
