"""The one door to the API server: rate-limited, counted, timed out, errors typed.

:class:`KubeClient` wraps a ``kubernetes_asyncio`` ``ApiClient`` (which brings kubeconfig
and in-cluster auth, TLS and the HTTP session) and speaks JSON dicts to it:

- :meth:`KubeClient.request` for every non-watch call; :meth:`KubeClient.stream` opens a
  watch and yields its events as they arrive;
- each request first takes a token from the :class:`~drivers.kube.ratelimit.TokenBucket`,
  is counted by verb in the :class:`~drivers.kube.metrics.RequestCounter` (and timed, if
  it asks), and runs under a timeout (``request_timeout``; a watch: connect + headers,
  then idle reads);
- every failure is a :class:`~drivers.kube.errors.KubeApiError` chained from the
  transport error (``ApiException``, ``aiohttp.ClientError``, ``TimeoutError``), whose
  one-line message names the verb, resource and namespace (and, when the server cannot be
  reached, the server's address and that it must be reachable from here).

Objects travel as parsed JSON (``KubeObject``), narrowed into typed views at the edge
(:mod:`drivers.kube.views`): the generated models would cost a deserialisation per
watch event and hide fields the machines need verbatim (annotations, templates).
Called by :mod:`drivers.kube.resources`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, TypeAlias, cast

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from drivers.kube.errors import (
    ApiServerError,
    ApiTimeout,
    ApiUnreachable,
    KubeApiError,
    from_api_exception,
    scope,
)
from drivers.kube.metrics import RequestCounter
from drivers.kube.ratelimit import TokenBucket

#: A Kubernetes object (or list, or watch event) as parsed JSON.
KubeObject: TypeAlias = dict[str, Any]
Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete"]
Query = Sequence[tuple[str, str]]

_OBJECT_RESPONSES = {200: "object", 201: "object", 202: "object"}


class KubeClient:
    """JSON over the API server with a rate limit, request counts and timeouts."""

    def __init__(self, api: ApiClient, *, limiter: TokenBucket | None = None,
                 counter: RequestCounter | None = None, request_timeout: float = 15.0,
                 connect_timeout: float = 5.0) -> None:
        self.api = api
        self.limiter = limiter or TokenBucket(qps=0, burst=1)
        self.counter = counter or RequestCounter()
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout

    async def close(self) -> None:
        await self.api.close()

    @property
    def host(self) -> str:
        """The API server's address, as the configuration names it."""
        return str(self.api.configuration.host)

    async def request(self, verb: Verb, method: str, path: str, *, resource: str,
                      namespace: str | None = None, query: Query = (), body: object = None,
                      content_type: str = "application/json",
                      timeout_seconds: float | None = None) -> KubeObject:
        """One API call; the decoded JSON body, or a typed :class:`KubeApiError`.

        ``resource``/``namespace`` name what the call acts on, for counts and errors.
        """
        limit = self.request_timeout if timeout_seconds is None else timeout_seconds
        where = scope(resource, namespace)
        await self.limiter.acquire()
        self.counter.sent(verb, resource)
        started = time.perf_counter() if self.counter.timing else None
        try:
            async with asyncio.timeout(limit):
                result = await self.api.call_api(
                    path, method, query_params=list(query),
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body, auth_settings=["BearerToken"],
                    response_types_map=_OBJECT_RESPONSES, _return_http_data_only=True,
                    _preload_content=True, _request_timeout=limit)
        except ApiException as exc:
            raise self._failed(from_api_exception(exc, verb=verb, path=path, resource=resource,
                                                  namespace=namespace)) from exc
        except TimeoutError as exc:
            raise self._failed(ApiTimeout(
                f"{verb} {where}: no answer from {self.host} within {limit}s", verb=verb,
                path=path, resource=resource, namespace=namespace)) from exc
        except aiohttp.ClientError as exc:
            raise self._failed(self._unreachable(exc, verb, path, resource, namespace)) from exc
        finally:
            if started is not None:  # answered or failed: the time the client waited
                self.counter.took(verb, time.perf_counter() - started)
        if not isinstance(result, dict):
            raise self._failed(ApiServerError(f"{verb} {where}: the answer is not a JSON object",
                                              verb=verb, path=path, resource=resource,
                                              namespace=namespace))
        return result

    def _unreachable(self, exc: aiohttp.ClientError, verb: str, path: str, resource: str,
                     namespace: str | None) -> ApiUnreachable:
        where = scope(resource, namespace)
        if not isinstance(exc, aiohttp.ClientConnectorError):  # connected, then it broke
            return ApiUnreachable(f"{verb} {where}: the connection to {self.host} broke: "
                                  f"{type(exc).__name__}: {exc}", verb=verb, path=path,
                                  resource=resource, namespace=namespace)
        return ApiUnreachable(
            f"cannot reach the Kubernetes API server at {self.host} ({verb} {where}): "
            f"{type(exc).__name__}: {exc}", verb=verb, path=path, resource=resource,
            namespace=namespace,
            hint=f"check that the kubeconfig's server address {self.host} is right and that "
                 "the API server is running and reachable from here")

    @contextlib.asynccontextmanager
    async def stream(self, path: str, *, resource: str, query: Query, idle_timeout: float,
                     namespace: str | None = None,
                     ) -> AsyncIterator[AsyncIterator[KubeObject]]:
        """Open a watch; yields an iterator of its events (ends when the server ends it).

        ``idle_timeout``: the longest silence tolerated between two events (the server's
        ``timeoutSeconds`` plus a margin, since bookmarks may be rare).
        """
        await self.limiter.acquire()
        self.counter.sent("watch", resource)
        timeouts = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout,
                                         sock_read=idle_timeout)
        try:
            async with asyncio.timeout(self.connect_timeout + self.request_timeout):
                raw = await self.api.call_api(
                    path, "GET", query_params=list(query),
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False,
                    _request_timeout=timeouts)
        except TimeoutError as exc:
            raise self._failed(ApiTimeout(
                f"watch {scope(resource, namespace)}: no answer from {self.host}",
                verb="watch", path=path, resource=resource, namespace=namespace)) from exc
        except aiohttp.ClientError as exc:
            raise self._failed(self._unreachable(exc, "watch", path, resource,
                                                 namespace)) from exc
        response = cast(aiohttp.ClientResponse, raw)
        try:
            if response.status != 200:
                data = await response.read()
                transport = ApiException(status=response.status, reason=response.reason)
                transport.body, transport.headers = data, response.headers
                raise self._failed(from_api_exception(
                    transport, verb="watch", path=path, resource=resource,
                    namespace=namespace)) from transport
            yield self._events(response, path, resource, namespace)
        finally:
            response.close()

    async def _events(self, response: aiohttp.ClientResponse, path: str, resource: str,
                      namespace: str | None) -> AsyncIterator[KubeObject]:
        where = scope(resource, namespace)
        while True:
            try:
                line = await response.content.readline()
            except TimeoutError as exc:
                raise self._failed(ApiTimeout(f"watch {where}: silent for too long",
                                              verb="watch", path=path, resource=resource,
                                              namespace=namespace)) from exc
            except aiohttp.ClientError as exc:
                raise self._failed(self._unreachable(exc, "watch", path, resource,
                                                     namespace)) from exc
            if not line:
                return
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise self._failed(ApiServerError(f"watch {where}: undecodable event",
                                                  verb="watch", path=path, resource=resource,
                                                  namespace=namespace)) from exc
            if isinstance(event, dict):
                yield event

    def _failed(self, error: KubeApiError) -> KubeApiError:
        self.counter.failed(error.verb, error.status or error.reason.lower())
        return error
