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
:class:`ApiNotFound`                404      no         no such object
:class:`ApiNamespaceNotFound`       404      no         create in a namespace that does not exist
:class:`ApiConflict`                409      yes        stale resourceVersion/precondition
:class:`ApiAlreadyExists`           409      no         ``reason: AlreadyExists``
:class:`ApiGone`                    410      no         watch resourceVersion too old
:class:`ApiTooManyRequests`         429      yes        throttled (``retry_after``)
:class:`ApiServerError`             5xx      yes        the server failed
:class:`ApiTimeout`                 504/--   yes        no answer in time
:class:`ApiUnreachable`             --       yes        connection refused/reset
==================================  =======  =========  ==================================

Every message is one line that names what failed (verb, resource, namespace) and, as the
``hint``, what to fix: an RBAC 403 names the missing rule (:func:`rbac_rule`), a
create in a missing namespace says the namespace does not exist, an unreachable server is
named by its address (the client adds it).

:func:`action_error` maps one onto the worker's ``RetryableActionError`` /
``TerminalActionError`` (keeping the API ``reason`` as the recorded ``error_class``).
Called by the client, the cache, the observer and the action handlers.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from kubernetes_asyncio.client.exceptions import ApiException

from controlplane.errors import ControlPlaneError
from controlplane.worker.errors import ActionError, RetryableActionError, TerminalActionError


class KubeApiError(ControlPlaneError):
    """A Kubernetes API call failed. ``reason`` is the Status reason (``NotFound``...)."""

    retryable: ClassVar[bool] = False
    default_reason: ClassVar[str] = "Unknown"

    def __init__(self, message: str, *, status: int = 0, reason: str = "", verb: str = "",
                 path: str = "", resource: str = "", namespace: str | None = None,
                 retry_after: float | None = None, details: dict[str, Any] | None = None,
                 hint: str = "") -> None:
        super().__init__(one_line(message), hint=one_line(hint))
        self.status = status
        self.reason = reason or self.default_reason
        self.verb = verb
        self.path = path
        self.resource = resource
        self.namespace = namespace
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


class ApiNamespaceNotFound(ApiNotFound):
    """A create named a namespace that does not exist (``namespaces "x" not found``)."""


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


#: Core resources the driver uses that live in a namespace (for the wording of errors).
NAMESPACED = frozenset({"pods", "events"})

#: How a real API server words an RBAC refusal: 'User "u" cannot patch resource "pods"'.
#: Other 403s (quota exceeded, PodSecurity, a namespace being deleted) are not RBAC's, and
#: naming a missing rule for them would send the operator the wrong way.
RBAC_REFUSAL = re.compile(r'cannot [a-z]+ resource "')


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


def scope(resource: str, namespace: str | None) -> str:
    """Where a request acted, in words: ``pods in namespace "a"``, ``nodes``."""
    if namespace:
        return f'{resource} in namespace "{namespace}"'
    return f"{resource} in all namespaces" if resource in NAMESPACED else resource


def rbac_rule(verb: str, resource: str, namespace: str | None) -> str:
    """The RBAC rule that lets ``verb`` on ``resource`` (core group) through, in words."""
    rule = f'apiGroups [""], resources ["{resource}"], verbs ["{verb}"]'
    if namespace:
        return f'the RBAC rule missing is {rule}: grant it with a Role (and RoleBinding) in ' \
               f'namespace "{namespace}"'
    return f"the RBAC rule missing is {rule}: grant it with a ClusterRole (and " \
           "ClusterRoleBinding), since the request is cluster-wide"


def from_status(status: int, body: object, *, verb: str, path: str, resource: str = "",
                namespace: str | None = None, retry_after: str | None = None) -> KubeApiError:
    """The typed error for an HTTP ``status`` and its ``Status`` body (raise it ``from``).

    ``resource``/``namespace`` (what the request named) make the message and the hint say
    what to fix; without them the path stands in.
    """
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
    what = scope(resource, namespace) if resource else path
    text = f"{verb} {what}: {status} {reason or cls.default_reason}: {message}"
    fix = ""
    if cls is ApiForbidden and resource:
        text = f"forbidden: cannot {verb} {what}: {message}"
        if RBAC_REFUSAL.search(message):  # the server names who; we name the rule: the fix
            fix = rbac_rule(verb, resource, namespace)
    elif cls is ApiNotFound and _names_namespace(details, resource):
        # Creating in a missing namespace is a 404 about the NAMESPACE (details.kind
        # "namespaces"), not about the object: a real API server answers exactly so.
        missing = str((details or {}).get("name") or namespace or "")
        cls = ApiNamespaceNotFound
        text = f'namespace "{missing}" does not exist: cannot {verb} {resource} in it'
        fix = f'create namespace "{missing}" first, or name an existing namespace'
    return cls(text, status=status, reason=reason, verb=verb, path=path, resource=resource,
               namespace=namespace, retry_after=after, details=details, hint=fix)


def _names_namespace(details: dict[str, Any] | None, resource: str) -> bool:
    return bool(details) and resource not in ("", "namespaces") and \
        (details or {}).get("kind") == "namespaces"


def from_api_exception(exc: ApiException, *, verb: str, path: str, resource: str = "",
                       namespace: str | None = None) -> KubeApiError:
    retry_after = exc.headers.get("Retry-After") if exc.headers is not None else None
    return from_status(int(exc.status or 0), exc.body, verb=verb, path=path,
                       resource=resource, namespace=namespace,
                       retry_after=None if retry_after is None else str(retry_after))


def action_error(exc: KubeApiError, what: str) -> ActionError:
    """The worker's error for a failed action (raise it ``from exc``)."""
    cls: type[ActionError] = RetryableActionError if exc.retryable else TerminalActionError
    error = cls(f"{what}: {exc}")
    error.error_class = exc.reason
    return error
