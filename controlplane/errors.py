"""The root of the control plane's errors: every user-facing error says what and how to fix.

Each layer has its own ``errors.py`` whose classes derive from :class:`ControlPlaneError`;
the CLI prints ``str(error)`` as one line and exits non-zero, never a traceback.
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    """An error with a message that names what is wrong and, in ``hint``, the fix."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(ControlPlaneError):
    """Bad input from the operator (flags, ids, specs)."""

    exit_code = 2
