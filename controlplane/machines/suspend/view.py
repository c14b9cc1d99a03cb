"""A suspension read from its state: it succeeded when the workload is ``Suspended`` with a
verified checkpoint to resume from. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.machines.base import views
from controlplane.machines.suspend.machine import SuspendPhase, SuspendState


class SuspendView(views.CapturingView, state=SuspendState,
                  success=frozenset({SuspendPhase.SUSPENDED})):
    waiting: Mapping[str, str] = {
        SuspendPhase.CHECKPOINTING: views.CHECKPOINTING,
        SuspendPhase.DELETING_SOURCE: views.DELETING_SOURCE,
        SuspendPhase.UNSTICKING: views.UNSTICKING,
        SuspendPhase.WAKING_IN_PLACE: views.WAKING_IN_PLACE}

    def succeeded(self, s: SuspendState) -> tuple[str, str]:
        return "Suspended", f"resume from {s.artifact}"

    def cancelled(self, s: SuspendState) -> tuple[str, str]:
        return views.cancelled(None, "workload resumed in place")
