"""Errors of the node agent: why a capture or a restore did not happen.

Each carries a short ``reason`` (CamelCase, like Kubernetes reasons) that the agent writes
into its failure report on the pod, followed by the message: ``report-reason`` for a
capture, ``restore-failure`` for a restore. Raised by the dumpers and the agent's jobs.
"""

from __future__ import annotations

from typing import ClassVar

from controlplane.errors import ControlPlaneError


class AgentError(ControlPlaneError):
    reason: ClassVar[str] = "AgentError"

    def report(self) -> str:
        """What goes into the pod annotation: ``Reason: message``."""
        return f"{self.reason}: {self}"


class RequestRefused(AgentError):
    """The capture request does not apply to this pod (UID, node, version, artifact)."""

    reason = "Refused"


class DumpFailed(AgentError):
    """The dumper could not capture the workload."""

    reason = "DumpFailed"


class RestoreFailed(AgentError):
    """The dumper could not restore the workload from the artifact."""

    reason = "RestoreFailed"


class RestoreUnsupported(RestoreFailed):
    """This dumper cannot restore (the runtime restores, or the format is not its own)."""

    reason = "RestoreUnsupported"


class PagesLost(AgentError):
    """A lazy (post-copy) transfer broke off once a target could run: the copies that
    could not be kept were removed; the message says which."""

    reason = "PagesLost"
