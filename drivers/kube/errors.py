"""Typed Kubernetes API errors, mapped from a ``Status`` and chained from the transport error.

Every call through :class:`~drivers.kube.client.KubeClient` raises a subclass of
:class:`KubeApiError` (never a raw ``ApiException``, ``aiohttp`` or timeout error); the
original is the ``__cause__``. Retryability is part of the type, as in the worker's own
errors:

==================================  =======  =========  ==================================
class                               status   retryable  meaning
==================================  =======  =========  ==================================
:class:`ApiBadRequest`              400/422  no         malformed or invalid (``Invalid``)
:class:`ApiUnauthorized`            401      no         credentials missing or expired
:class:`ApiForbidden`               403      no         RBAC says no
:class:`ApiNotFound`                404      no         no such object (or namespace)
:class:`ApiConflict`                409      yes        stale resourceVersion/precondition
:class:`ApiAlreadyExists`           409      no         ``reason: AlreadyExists``
:class:`ApiGone`                    410      no         watch resourceVersion too old
:class:`ApiTooManyRequests`         429      yes        throttled (``retry_after``)
:class:`ApiServerError`             5xx      yes        the server failed
:class:`ApiTimeout`                 504/--   yes        no answer in time
:class:`ApiUnreachable`             --       yes        connection refused/reset
==================================  =======  =========  ==================================

:func:`action_error` maps one onto the worker's ``RetryableActionError`` /
``TerminalActionError`` (keeping the API ``reason`` as the recorded ``error_class``).
Called by the client, the cache, the observer and the action handlers.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from kubernetes_asyncio.client.exceptions import ApiException

from controlplane.errors import ControlPlaneError
from controlplane.worker.errors import ActionError, RetryableActionError, TerminalActionError


class KubeApiError(ControlPlaneError):
    """A Kubernetes API call failed. ``reason`` is the Status reason (``NotFound``...)."""

    retryable: ClassVar[bool] = False
    default_reason: ClassVar[str] = "Unknown"

    def __init__(self, message: str, *, status: int = 0, reason: str = "", verb: str = "",
                 path: str = "", retry_after: float | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or self.default_reason
        self.verb = verb
        self.path = path
        self.retry_after = retry_after
        self.details = details or {}

    def causes(self) -> list[dict[str, Any]]:
        listed = self.details.get("causes")
        return [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []


class ApiBadRequest(KubeApiError):
    default_reason = "Invalid"


class ApiUnauthorized(KubeApiError):
    default_reason = "Unauthorized"


class ApiForbidden(KubeApiError):
    default_reason = "Forbidden"


class ApiNotFound(KubeApiError):
    default_reason = "NotFound"


class ApiConflict(KubeApiError):
    retryable = True
    default_reason = "Conflict"


class ApiAlreadyExists(ApiConflict):
    retryable = False
    default_reason = "AlreadyExists"


class ApiGone(KubeApiError):
    default_reason = "Expired"


class ApiTransientError(KubeApiError):
    """Worth retrying: the server or the network, not the request, is the problem."""

    retryable = True
    default_reason = "ServiceUnavailable"


class ApiTooManyRequests(ApiTransientError):
    default_reason = "TooManyRequests"


class ApiServerError(ApiTransientError):
    default_reason = "InternalError"


class ApiTimeout(ApiTransientError):
    default_reason = "Timeout"


class ApiUnreachable(ApiTransientError):
    default_reason = "Unreachable"


def _status_class(status: int, reason: str) -> type[KubeApiError]:
    if status == 409:
        return ApiAlreadyExists if reason == "AlreadyExists" else ApiConflict
    if status == 504:
        return ApiTimeout
    if status >= 500:
        return ApiServerError
    return {400: ApiBadRequest, 401: ApiUnauthorized, 403: ApiForbidden, 404: ApiNotFound,
            410: ApiGone, 422: ApiBadRequest, 429: ApiTooManyRequests}.get(status, KubeApiError)


def parse_status(body: object) -> dict[str, Any]:
    """The ``Status`` object in an error body (``{}`` if it is not one)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def from_status(status: int, body: object, *, verb: str, path: str,
                retry_after: str | None = None) -> KubeApiError:
    """The typed error for an HTTP ``status`` and its ``Status`` body (raise it ``from``)."""
    parsed = parse_status(body)
    reason = str(parsed.get("reason") or "")
    message = str(parsed.get("message") or f"HTTP {status}")
    details = parsed.get("details") if isinstance(parsed.get("details"), dict) else {}
    after: float | None = None
    hint = retry_after or (details or {}).get("retryAfterSeconds")
    if hint is not None:
        try:
            after = float(hint)
        except (TypeError, ValueError):
            after = None
    cls = _status_class(status, reason)
    return cls(f"{verb} {path}: {status} {reason or cls.default_reason}: {message}",
               status=status, reason=reason, verb=verb, path=path, retry_after=after,
               details=details)


def from_api_exception(exc: ApiException, *, verb: str, path: str) -> KubeApiError:
    retry_after = exc.headers.get("Retry-After") if exc.headers is not None else None
    return from_status(int(exc.status or 0), exc.body, verb=verb, path=path,
                       retry_after=None if retry_after is None else str(retry_after))


def action_error(exc: KubeApiError, what: str) -> ActionError:
    """The worker's error for a failed action (raise it ``from exc``)."""
    cls: type[ActionError] = RetryableActionError if exc.retryable else TerminalActionError
    error = cls(f"{what}: {exc}")
    error.error_class = exc.reason
    return error
