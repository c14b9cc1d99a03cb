"""The simulated API server's HTTP face: the core/v1 and apps/v1 subset over aiohttp.web.

Serves ``/api/v1`` for ``namespaces``, ``pods``, ``nodes``, ``events`` and
``persistentvolumeclaims``, and ``/apis/apps/v1`` for ``deployments``, ``replicasets``
and ``statefulsets`` like a real
API server: GET (one or LIST with ``labelSelector``, ``fieldSelector``, ``limit`` +
``continue``), WATCH (``?watch=1``, see :mod:`drivers.sim.watch`), POST, PUT, PATCH
(strategic merge, merge, JSON patch), DELETE (``DeleteOptions`` with
``preconditions`` and ``gracePeriodSeconds``, in the body or the query), the ``status``
subresource, plus ``/version``, ``/api``, ``/apis``, ``/apis/apps``, ``/api/v1``,
``/apis/apps/v1`` discovery and
``/healthz``. Every refusal is a ``Status`` object with the real ``reason`` and ``code``
(429 carries ``Retry-After``). ``pods/NAME/eviction`` deletes like a DELETE (no
disruption budgets). ``dryRun=All`` validates and answers without storing;
``fieldValidation=Strict`` refuses unknown fields (see :mod:`drivers.sim.validation`).
A GET or LIST whose ``Accept`` asks for ``as=Table`` (what ``kubectl get`` sends) is
answered with kubectl's columns for pods, nodes, events and namespaces
(:mod:`drivers.sim.tables`).

Every request is counted by verb (``requests``) and passes the fault hooks first. The
audit (``audit``, served as JSON at ``/sim/audit``) counts them by who sent them (the
simulator does not authenticate: a bearer token stands for the user's name), verb,
resource, subresource and namespace, as a real API server's audit log would show them:
the input of the RBAC exactness test (``tests/deploy``).
Called by :class:`~drivers.sim.cluster.SimCluster`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from controlplane.logs import get_logger
from drivers.sim import custom, selectors, tables, validation
from drivers.sim.faults import Faults, Request
from drivers.sim.objects import RESOURCES, ApiError, Obj, Resource, dumps, meta
from drivers.sim.store import Store
from drivers.sim.watch import WatchHub, parse_resource_version, stream, stream_error

log = get_logger("drivers.sim.server")

VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-sim", "platform": "linux/amd64"}


@dataclass(frozen=True)
class Target:
    """What a ``/api/v1/...`` path names."""

    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(tail: str, group: str = "", version: str = "v1",
               served: dict[str, Resource] | None = None) -> Target:
    """What ``/api/v1/{tail}`` (``group`` empty) or ``/apis/{group}/{version}/{tail}``
    names, among the ``served`` resources (default: the built-in ones)."""
    parts = [p for p in tail.strip("/").split("/") if p]
    if not parts:
        raise ApiError(404, "the server could not find the requested resource")
    if parts[0] == "namespaces" and len(parts) >= 3 and parts[2] != "status":
        namespace, rest = parts[1], parts[2:]
    else:
        namespace, rest = None, parts
    resource = (RESOURCES if served is None else served).get(rest[0])
    if resource is not None and (resource.group, resource.version) != (group, version):
        resource = None
    if resource is None or len(rest) > 3 or (namespace is not None and not resource.namespaced):
        raise ApiError(404, "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if resource.namespaced and namespace is None and name is not None:
        raise ApiError(404, "the server could not find the requested resource")
    if sub is not None and (sub != "status" or not resource.has_status) and \
            (sub, resource.plural) not in (("binding", "pods"), ("eviction", "pods")):
        raise ApiError(404, f"the server could not find the requested resource ({sub})")
    return Target(resource, namespace, name, sub)


def verb_of(method: str, target: Target, watch: bool) -> str:
    if method == "GET":
        return "get" if target.name else ("watch" if watch else "list")
    if method == "DELETE" and not target.name:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower())


def _number(value: str | None, name: str) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ApiError(400, f"invalid {name} {value!r}: not a number") from None


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true")


def _json(body: Obj, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)


def _static(body: Obj | str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=body) if isinstance(body, str) else _json(body)
    return handler


def error_response(error: ApiError) -> web.Response:
    response = _json(error.status(), error.code)
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


class SimServer:
    """The aiohttp application over one store, its watch hub and fault hooks."""

    def __init__(self, store: Store, hub: WatchHub, faults: Faults) -> None:
        self.store = store
        self.hub = hub
        self.faults = faults
        self.requests: Counter[str] = Counter()  # verb -> requests served or refused
        self.requests_by_resource: Counter[tuple[str, str]] = Counter()
        #: (user, verb, resource, subresource, namespace) -> requests ("" when none).
        self.audit: Counter[tuple[str, str, str, str, str]] = Counter()
        self.closing = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/version", _static(dict(VERSION)))
        for probe in ("/healthz", "/readyz", "/livez"):
            app.router.add_get(probe, _static("ok"))
        app.router.add_get("/api", _static(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}))
        app.router.add_get("/apis", self._groups)
        app.router.add_get("/apis/{group}", self._group)
        app.router.add_get("/api/v1", self._versions)
        app.router.add_get("/apis/{group}/{version}", self._versions)
        app.router.add_get("/openapi/v3", self._openapi)
        app.router.add_get("/openapi/v3/{gv:.+}", self._openapi)
        app.router.add_get("/sim/audit", self._audit)
        app.router.add_route("*", "/api/v1/{tail:.+}", self._dispatch)
        app.router.add_route("*", "/apis/{group}/{version}/{tail:.+}", self._dispatch)
        return app

    def _group_versions(self) -> dict[str, list[str]]:
        """Served API groups (``""``: core) and their versions, built-ins first."""
        out: dict[str, list[str]] = {}
        for r in self.store.resources.values():
            versions = out.setdefault(r.group, [])
            if r.version not in versions:
                versions.append(r.version)
        return out

    async def _groups(self, _: web.Request) -> web.StreamResponse:
        return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            _group(g, vs) for g, vs in self._group_versions().items() if g]})

    async def _group(self, request: web.Request) -> web.StreamResponse:
        group = request.match_info["group"]
        versions = self._group_versions().get(group)
        if not group or versions is None:
            return error_response(ApiError(404, "the server could not find the requested "
                                           "resource"))
        return _json({"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)})

    async def _versions(self, request: web.Request) -> web.StreamResponse:
        group = request.match_info.get("group", "")
        version = request.match_info.get("version", "v1")
        if version not in self._group_versions().get(group, []):
            return error_response(ApiError(404, "the server could not find the requested "
                                           "resource"))
        return _json(self._discovery(group, version))

    async def _openapi(self, request: web.Request) -> web.StreamResponse:
        """OpenAPI v3: the root, or one group version's document (``drivers.sim.custom``)."""
        served: dict[str, list[Resource]] = {}
        for r in self.store.resources.values():
            served.setdefault(r.group_version, []).append(r)
        docs = {gv: custom.openapi_group(rs) for gv, rs in served.items()}
        gv = request.match_info.get("gv")
        if gv is None:
            return _json(custom.openapi_root(docs, docs))
        doc = docs.get(gv.removeprefix("api/").removeprefix("apis/"))
        if doc is None:
            return error_response(ApiError(404, "the server could not find the requested "
                                           "resource"))
        return _json(doc)

    def _discovery(self, group: str, version: str = "v1") -> Obj:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                 "watch"]
        served = [r for r in self.store.resources.values()
                  if (r.group, r.version) == (group, version)]
        listed = [{"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                   "kind": r.kind, "verbs": verbs, **_SHORT_NAMES.get(r.plural, {}),
                   **({"shortNames": list(r.short_names)} if r.short_names else {}),
                   **({"categories": list(r.categories)} if r.categories else {})}
                  for r in served]
        listed += [{"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                    "kind": r.kind, "verbs": ["get", "patch", "update"]}
                   for r in served if r.has_status]
        if not group:
            listed.append({"name": "pods/eviction", "singularName": "", "namespaced": True,
                           "group": "policy", "version": "v1", "kind": "Eviction",
                           "verbs": ["create"]})
        return {"kind": "APIResourceList",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": listed}

    async def _audit(self, _: web.Request) -> web.StreamResponse:
        keys = ("user", "verb", "resource", "subresource", "namespace")
        return _json({"items": [{**dict(zip(keys, key, strict=True)), "count": n}
                                for key, n in sorted(self.audit.items())]})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            target = parse_path(request.match_info["tail"], request.match_info.get("group", ""),
                                request.match_info.get("version", "v1"), self.store.resources)
            query = request.query
            verb = verb_of(request.method, target, _flag(query.get("watch")))
            self.requests[verb] += 1
            self.requests_by_resource[(verb, target.resource.plural)] += 1
            auth = request.headers.get("Authorization", "")
            user = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
            self.audit[(user, verb, target.resource.plural, target.subresource or "",
                        target.namespace or "")] += 1
            hit = self.faults.take(Request(verb, target.resource.plural, target.namespace,
                                           target.name))
            if hit.delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.closing.wait(), hit.delay)
            if hit.error is not None:
                raise hit.error
            validation.check_options(verb, query.getall("dryRun", []),
                                     query.get("fieldValidation"))
            return await self._serve(request, target, verb)
        except ApiError as exc:
            return error_response(exc)
        except selectors.SelectorError as exc:
            return error_response(ApiError(400, str(exc)))
        except Exception as exc:  # a simulator bug still answers like an API server
            log.error("simulated API server: request failed", path=request.path,
                      error=repr(exc))
            return error_response(ApiError(500, f"internal error: {exc!r}"))

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc

    async def _serve(self, request: web.Request, t: Target, verb: str) -> web.StreamResponse:
        plural, ns, name, query = t.resource.plural, t.namespace or "", t.name or "", request.query
        dry_run = bool(query.getall("dryRun", []))
        strict = query.get("fieldValidation") == "Strict"
        if verb in ("list", "watch", "deletecollection"):
            selector = selectors.parse(query.get("labelSelector"), query.get("fieldSelector"))
            if verb == "watch":
                timeout = query.get("timeoutSeconds")
                _number(timeout, "timeoutSeconds")
                try:
                    watch = self.hub.open(t.resource, t.namespace, selector,
                                          resource_version=query.get("resourceVersion"),
                                          bookmarks=_flag(query.get("allowWatchBookmarks")),
                                          initial_events=_flag(query.get("sendInitialEvents")))
                except ApiError as exc:
                    if exc.code != 410:
                        raise
                    return await stream_error(request, exc)
                version = tables.wanted(request.headers.get("Accept", ""))
                rows = None if version is None else tables.watch_rows(
                    t.resource, version, query.get("includeObject"), lambda: datetime.now(UTC))
                return await stream(request, self.hub, watch,
                                    timeout_seconds=_number(timeout, "timeoutSeconds"),
                                    transform=rows)
            if verb == "list":
                if query.get("resourceVersion"):  # checked, then ignored: lists are current
                    parse_resource_version(query["resourceVersion"], watch=False)
                body = self._list(t, selector, query.get("limit"), query.get("continue"))
                return _json(self._as_table(request, t, body["items"], body["metadata"]) or body)
            items, _ = self.store.select(plural, t.namespace, selector)
            for obj in items:
                self.store.delete(plural, str(meta(obj).get("namespace") or ""),
                                  str(meta(obj)["name"]), dry_run=dry_run)
            return self._list_response(t.resource, items, None)
        if verb == "get":
            obj = self.store.get(plural, ns, name)
            metadata = {"resourceVersion": str(meta(obj).get("resourceVersion", ""))}
            return _json(self._as_table(request, t, [obj], metadata) or obj)
        if verb == "create":
            if t.resource.namespaced and t.namespace is None:
                raise ApiError(405, f"create {plural} needs a namespace in the path")
            body = await self._body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            if t.subresource == "binding":
                if dry_run:
                    raise ApiError(400, "dryRun of pods/binding is not supported by the simulator")
                return _json(self.store.bind(ns, name, body), 201)
            if t.subresource == "eviction":
                return _json(self._evict(t, body, dry_run), 201)
            if strict:
                _strict(t.resource, body)
            return _json(self.store.create(plural, ns, body, dry_run=dry_run), 201)
        if verb == "update":
            body = await self._body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            if meta(body).get("name") not in (None, name):
                raise ApiError(400, "the name of the object does not match the name on the URL")
            if strict:
                _strict(t.resource, body)
            return _json(self.store.update(plural, ns, name, body, subresource=t.subresource,
                                           dry_run=dry_run))
        if verb == "patch":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            body = await self._body(request)
            return _json(self.store.patch(
                plural, ns, name, content_type, body, subresource=t.subresource,
                dry_run=dry_run, check=_strict_patch(t.resource) if strict else None))
        if verb == "delete":
            return _json(self._delete(t, await self._body(request), query, dry_run))
        raise ApiError(405, f"method {request.method} is not allowed here")

    def _as_table(self, request: web.Request, t: Target, items: list[Obj],
                  metadata: Obj) -> Obj | None:
        """The ``Table`` kubectl asks for in ``Accept`` (see :mod:`drivers.sim.tables`), or
        ``None``: the plain object or list, when it was not asked for or has no table."""
        version = tables.wanted(request.headers.get("Accept", ""))
        if version is None:
            return None
        return tables.table(t.resource, items, version=version, list_metadata=metadata,
                            include=request.query.get("includeObject"), now=datetime.now(UTC))

    def _delete(self, t: Target, body: Any, query: Any, dry_run: bool = False) -> Obj:
        options = body if isinstance(body, dict) else {}
        preconditions = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        try:
            seconds = None if grace is None else int(grace)
        except ValueError:
            raise ApiError(400, f"invalid gracePeriodSeconds {grace!r}") from None
        return self.store.delete(t.resource.plural, t.namespace or "", t.name or "",
                                 uid=preconditions.get("uid"),
                                 resource_version=preconditions.get("resourceVersion"),
                                 grace=seconds, dry_run=dry_run)

    def _evict(self, t: Target, body: Any, dry_run: bool) -> Obj:
        """``pods/{name}/eviction``: a policy/v1 ``Eviction`` deletes the pod with its
        ``deleteOptions`` (no PodDisruptionBudgets here, so nothing ever blocks it)."""
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiError(400, "the object provided is unrecognized (must be of type Eviction)")
        if meta(body).get("name") not in (None, "", t.name):
            raise ApiError(400, "name in URL does not match name in Eviction object")
        self._delete(t, body.get("deleteOptions"), {}, dry_run)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    def _list(self, t: Target, selector: selectors.Selector, limit: str | None,
              token: str | None) -> Obj:
        items, rv = self.store.select(t.resource.plural, t.namespace, selector)
        if token:
            try:
                start = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise ApiError(400, "invalid continue token") from None
            items = [o for o in items if _sort_key(o) > tuple(start)]
        next_token = None
        size = int(_number(limit, "limit") or 0)
        if size > 0 and len(items) > size:
            items = items[:size]
            start = list(_sort_key(items[-1]))
            next_token = base64.urlsafe_b64encode(json.dumps({"start": start}).encode()).decode()
        return self._list_body(t.resource, items, rv, next_token)

    def _list_body(self, resource: Resource, items: list[Obj], rv: int | None,
                   token: str | None) -> Obj:
        metadata: Obj = {"resourceVersion": str(self.store.rv if rv is None else rv)}
        if token:
            metadata["continue"] = token
        return {"kind": resource.list_kind, "apiVersion": resource.api_version,
                "metadata": metadata,
                "items": items}

    def _list_response(self, resource: Resource, items: list[Obj],
                       token: str | None) -> web.Response:
        return _json(self._list_body(resource, items, None, token))


#: What a real server's discovery says beside each name: ``kubectl get po``, ``get all``.
_SHORT_NAMES: dict[str, Obj] = {
    "pods": {"shortNames": ["po"], "categories": ["all"]},
    "nodes": {"shortNames": ["no"]},
    "namespaces": {"shortNames": ["ns"]},
    "events": {"shortNames": ["ev"]},
    "persistentvolumeclaims": {"shortNames": ["pvc"]},
    "deployments": {"shortNames": ["deploy"], "categories": ["all"]},
    "replicasets": {"shortNames": ["rs"], "categories": ["all"]},
    "statefulsets": {"shortNames": ["sts"], "categories": ["all"]},
}


def _group(name: str, versions: list[str]) -> Obj:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def _strict(resource: Resource, body: Obj) -> None:
    """``fieldValidation=Strict`` on a create or update: ``400`` naming unknown fields."""
    unknown = validation.unknown_fields(resource, body)
    if unknown:
        raise ApiError(400, f'{resource.kind} in version "v1" cannot be handled as a '
                       f"{resource.kind}: strict decoding error: "
                       + ", ".join(f'unknown field "{f}"' for f in unknown))


def _strict_patch(resource: Resource) -> Callable[[Obj], None]:
    """``fieldValidation=Strict`` on a patch: ``422`` on the field ``patch``, as a real
    server refuses a patch whose result has unknown fields."""
    def check(patched: Obj) -> None:
        unknown = validation.unknown_fields(resource, patched)
        if unknown:
            why = "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in unknown)
            raise ApiError(422, f' "" is invalid: patch: Invalid value: "{dumps(patched)}": '
                           f"{why}", details={"causes": [
                               {"reason": "FieldValueInvalid", "field": "patch",
                                "message": f'Invalid value: "{dumps(patched)}": {why}'}]})
    return check


def _sort_key(obj: Obj) -> tuple[str, str]:
    return (str(meta(obj).get("namespace") or ""), str(meta(obj).get("name") or ""))
