"""Errors action handlers raise: retryable (retried with backoff) vs terminal (an event)."""

from __future__ import annotations

from controlplane.errors import ControlPlaneError


class ActionError(ControlPlaneError):
    """An action did not take effect. ``error_class`` is what history records."""

    error_class = "ActionError"


class RetryableActionError(ActionError):
    """Transient (timeouts, 429, 5xx, conflicts on a stale read): try again later."""

    error_class = "Retryable"


class TerminalActionError(ActionError):
    """Will not succeed by retrying (403, invalid request): recorded as ``ActionFailed``."""

    error_class = "Terminal"
