"""Why a checkpoint handoff did not arrive: refused by the source, or interrupted.

Raised by :func:`~drivers.agent.handoff.client.fetch_checkpoint` (and the framing it
uses); its caller, the target node's agent, falls back to the registry copy. Each
error's ``reason`` names what failed and the fix; ``retryable`` says whether the same
fetch may succeed if tried again.
"""

from __future__ import annotations

from typing import ClassVar

from controlplane.errors import ControlPlaneError


class HandoffFailed(ControlPlaneError):
    """The checkpoint did not arrive; no partial file is left behind."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, hint: str = "", status: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status  # the source's HTTP status, when it answered one

    @property
    def reason(self) -> str:
        """What failed and how to fix it, in one line (for a report or a log)."""
        return str(self)


class HandoffRefused(HandoffFailed):
    """The source answered no (authentication, wrong node, unknown or withdrawn
    checkpoint) and will answer the same again."""


class HandoffInterrupted(HandoffFailed):
    """The transfer did not complete (connection, timeout, truncated or corrupted stream,
    another fetch streaming): the same fetch may succeed if tried again."""

    retryable = True
