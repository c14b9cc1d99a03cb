"""Typed registry errors, chained from the transport error; retryability is in the type.

Every call of a registry backend (:mod:`drivers.registry.client` over HTTP,
:mod:`drivers.registry.layout` on disk) raises a subclass of :class:`RegistryError`, never
a raw ``aiohttp``, ``OSError`` or timeout error; the original is the ``__cause__``.

====================================  =======  =========  ================================
class                                 status   retryable  meaning
====================================  =======  =========  ================================
:class:`RegistryBadRequest`           400/4xx  no         the request is wrong (a bug, a
                                                          bad name or manifest)
:class:`RegistryUnauthorized`         401      no         no or wrong credentials, or the
                                                          token endpoint said no
:class:`RegistryForbidden`            403      no         authenticated, but not allowed
:class:`RegistryNotFound`             404      no         no such manifest, blob or repo
:class:`RegistryUnsupported`          405      no         the registry refuses the
                                                          operation (deletes disabled)
:class:`RegistryTooManyRequests`      429      yes        throttled (``retry_after``)
:class:`RegistryServerError`          5xx      yes        the registry failed
:class:`RegistryTimeout`              --       yes        no answer in time
:class:`RegistryUnreachable`          --       yes        connection refused/reset, disk
                                                          I/O error of the layout
:class:`RegistryBadResponse`          --       no         an answer we cannot trust
                                                          (digest mismatch, not JSON)
====================================  =======  =========  ================================

:func:`probe_error` turns one into the core's ``ProbeError`` (never "absent": gate 3) and
:func:`action_error` into the worker's ``RetryableActionError``/``TerminalActionError``.
Called by the backends, the observer, the action handler and the node agent.
"""

from __future__ import annotations

from typing import ClassVar

from controlplane.engine.observation import ProbeError
from controlplane.errors import ControlPlaneError
from controlplane.worker.errors import ActionError, RetryableActionError, TerminalActionError


class RegistryError(ControlPlaneError):
    """A registry operation failed. ``code`` is the OCI error code when the registry sent one."""

    retryable: ClassVar[bool] = False
    reason: ClassVar[str] = "RegistryError"

    def __init__(self, message: str, *, status: int = 0, code: str = "",
                 retry_after: float | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class RegistryBadRequest(RegistryError):
    reason = "BadRequest"


class RegistryUnauthorized(RegistryError):
    reason = "Unauthorized"


class RegistryForbidden(RegistryError):
    reason = "Forbidden"


class RegistryNotFound(RegistryError):
    reason = "NotFound"


class RegistryUnsupported(RegistryError):
    """405: the registry does not allow this operation (e.g. ``storage.delete`` disabled)."""

    reason = "MethodNotAllowed"


class RegistryBadResponse(RegistryError):
    reason = "BadResponse"


class RegistryTransientError(RegistryError):
    """Worth retrying: the registry or the network, not the request, is the problem."""

    retryable = True
    reason = "Unavailable"


class RegistryTooManyRequests(RegistryTransientError):
    reason = "TooManyRequests"


class RegistryServerError(RegistryTransientError):
    reason = "ServerError"


class RegistryTimeout(RegistryTransientError):
    reason = "Timeout"


class RegistryUnreachable(RegistryTransientError):
    reason = "Unreachable"


def for_status(status: int) -> type[RegistryError]:
    """The error class of an HTTP status the registry answered with."""
    if status >= 500:
        return RegistryServerError
    return {400: RegistryBadRequest, 401: RegistryUnauthorized, 403: RegistryForbidden,
            404: RegistryNotFound, 405: RegistryUnsupported,
            429: RegistryTooManyRequests}.get(status, RegistryBadRequest)


def probe_error(exc: RegistryError) -> ProbeError:
    """The observation of a failed probe: the truth is unknown, never "absent"."""
    return ProbeError(exc.reason, str(exc), retryable=exc.retryable)


def action_error(exc: RegistryError, what: str) -> ActionError:
    """The worker's error for a failed registry action (raise it ``from exc``)."""
    cls: type[ActionError] = RetryableActionError if exc.retryable else TerminalActionError
    error = cls(f"{what}: {exc}")
    error.error_class = exc.reason
    return error
